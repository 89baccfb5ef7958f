"""`python -m allocdoc ...`: the `allocdoc` command."""

from ._cli import main

main()
