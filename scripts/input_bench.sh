#!/usr/bin/env bash
# Whole-process figures for BENCHMARKS.md, "Input layer and diagnose": on a
# generated training log (shared/bench/gen_log.py), interleaved so that load
# from other jobs hits every variant alike:
#   parse FILE        the mapped-file scan
#   diagnose FILE     the scan plus rules and context clues (no second pass)
#   cat FILE | parse  the chunked stream scan of standard input (peak RSS)
#   cat FILE | diagnose
#   parse FILE.zst    decompressed as a stream
# Prints wall, user, sys and peak RSS per run, then the medians.
# Usage: scripts/input_bench.sh [BIN] [LOG] [RUNS]
set -euo pipefail
bin=${1:-target/release/allocdoc}
log=${2:-/tmp/allocdoc_bench_1g.log}
runs=${3:-3}
if [ ! -f "$log" ]; then
  python3 "$(dirname "$0")/../../shared/bench/gen_log.py" "$log" 1024 >/dev/null
fi
[ -f "$log.zst" ] || zstd -q -1 -T0 "$log" -o "$log.zst"
out=$(mktemp)
for _ in $(seq "$runs"); do
  /usr/bin/time -f "parse-file %e %U %S %M" "$bin" parse "$log" >/dev/null 2>>"$out"
  /usr/bin/time -f "diagnose-file %e %U %S %M" "$bin" diagnose "$log" >/dev/null 2>>"$out"
  cat "$log" | /usr/bin/time -f "parse-stdin %e %U %S %M" "$bin" parse >/dev/null 2>>"$out"
  cat "$log" | /usr/bin/time -f "diagnose-stdin %e %U %S %M" "$bin" diagnose >/dev/null 2>>"$out"
  /usr/bin/time -f "parse-zst %e %U %S %M" "$bin" parse "$log.zst" >/dev/null 2>>"$out"
done
python3 - "$out" "$(stat -c %s "$log")" <<'PY'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) == 5 and f[0].startswith(("parse-", "diagnose-")):
        name, wall, user, sys_, rss = f[0], *map(float, f[1:])
        runs.setdefault(name, []).append((wall, user + sys_, rss))
        print(f"{name:15} wall {wall:6.2f} s  user {user:5.2f} s  sys {sys_:5.2f} s  rss {rss / 1024:7.1f} MiB")
size = int(sys.argv[2])
print("medians: wall, CPU (user + sys), GB/s of wall, GB/s of CPU, peak RSS")
for name, r in runs.items():
    w = statistics.median(x[0] for x in r)
    c = statistics.median(x[1] for x in r)
    print(f"{name:15} {w:6.2f} s  {c:5.2f} s  {size / w / 1e9:5.2f} GB/s  {size / c / 1e9:5.2f} GB/s  {max(x[2] for x in r) / 1024:7.1f} MiB")
PY
rm -f "$out"
