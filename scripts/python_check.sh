#!/usr/bin/env bash
# The Python package end to end: builds the wheel once, installs it into a fresh
# virtual environment, and checks it against the cargo build:
#   - the wheel's `allocdoc` command: same stdout, stderr and exit code as target/$PROFILE/allocdoc
#     (python/tests/test_cli.py);
#   - the Python API: the same dicts as the command's --format json, the same errors
#     (python/tests/test_api.py);
#   - allocdoc.capture against a stand-in torch (python/tests/test_capture.py);
#   - the Dask fleet example on a local cluster over 1100 generated logs against
#     `allocdoc diagnose --each --format jsonl` (python/tests/test_fleet.py).
# No test may skip here. Needs python3 (3.9+) and PyPI (maturin, pytest, dask).
#   PROFILE=ci (default: release optimisation without LTO, as the tests) or release (the shipped build).
#   ALLOCDOC_CARGO_BIN=path: compare with this cargo-built binary instead of building one
#   (CI passes the one `cargo test --profile ci` built, saving a rebuild of the library).
set -euo pipefail
cd "$(dirname "$0")/.."
PROFILE=${PROFILE:-ci}
WORK=target/python-check
mkdir -p "$WORK"
step() { echo "=== $(date -u +%H:%M:%S) $*"; }

if [ -n "${ALLOCDOC_CARGO_BIN:-}" ]; then
  BIN=$(realpath "$ALLOCDOC_CARGO_BIN")
else
  step "cargo binary ($PROFILE)"
  cargo build --profile "$PROFILE" --bin allocdoc
  BIN=$PWD/target/$PROFILE/allocdoc
fi

step "wheel ($PROFILE)"
# maturin lives in its own environment, kept between runs.
if [ ! -x "$WORK/build/bin/maturin" ]; then
  python3 -m venv "$WORK/build"
  "$WORK/build/bin/pip" install --quiet "maturin>=1.9,<2"
fi
rm -rf "$WORK/wheels"
"$WORK/build/bin/maturin" build --profile "$PROFILE" --out "$WORK/wheels"
WHEEL=$(ls "$WORK"/wheels/allocdoc-*.whl)
echo "$WHEEL"

step "fresh virtual environment"
rm -rf "$WORK/venv"
python3 -m venv "$WORK/venv"
"$WORK/venv/bin/pip" install --quiet "$WHEEL" pytest "dask[bag,distributed]"

step "tests"
# The venv's bin first: `allocdoc` there is the wheel's command.
PATH="$PWD/$WORK/venv/bin:$PATH" ALLOCDOC_CARGO_BIN="$BIN" \
  "$WORK/venv/bin/python" -m pytest -q -rs -p no:cacheprovider python/tests 2>&1 | tee "$WORK/pytest.txt"
if grep -q -E "[0-9]+ skipped" "$WORK/pytest.txt"; then
  echo "python_check: a test was skipped (see above); every test must run here" >&2
  exit 1
fi
step "done"
