#!/usr/bin/env bash
# Allocator replay throughput (`cargo bench --features bench --bench replay`), run from a copy
# of the bench binary, as `cargo install` copies a binary into place.
#
# Why a copy: on the 2-vCPU AMD EPYC VM of BENCHMARKS.md, the LTO build of this
# bench ran `expandable_segments:True` at 8.7-9.1 M events/s from the file
# rust-lld wrote, and at 10.5-10.9 M from byte-identical copies (five of five)
# and from the file GNU ld wrote. Same code; only the page-cache pages behind
# the executable differ. See BENCHMARKS.md, "Measurement trap".
#
#   scripts/replay_bench.sh [RUNS]     (default 2 runs of the whole bench)
set -euo pipefail
cd "$(dirname "$0")/.."

RUNS=${1:-2}
BIN=$(cargo bench --features bench --bench replay --no-run 2>&1 | sed -n 's/.*Executable benches\/replay.rs (\(.*\))/\1/p')
[[ -x $BIN ]] || { echo "bench binary not found" >&2; exit 1; }
COPY=$(mktemp -d)/replay-bench
trap 'rm -rf "$(dirname "$COPY")"' EXIT
cp "$BIN" "$COPY"
echo "$(date -u '+%F %H:%M UTC'), load: $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) cores, copy of $BIN"
for _ in $(seq "$RUNS"); do
    "$COPY" --bench
done
