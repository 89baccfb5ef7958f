"""The wheel's `allocdoc` command: the binary's own code (src/main.rs,
compiled into the extension) run on this process's arguments."""

import signal
import sys


def main():
    from ._native import command

    # As the binary: Ctrl-C ends the process at once (Python's handler would
    # wait for the command to return).
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    # The program is named allocdoc in usage lines, also under `python -m allocdoc`.
    sys.exit(command(["allocdoc", *sys.argv[1:]]))
