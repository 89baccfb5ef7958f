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
grep -E '^(parse|diagnose)-' "$out" | awk -v bytes="$(stat -c %s "$log")" '
  { n[$1]++; w[$1, n[$1]] = $2; c[$1, n[$1]] = $3 + $4; r[$1] = ($5 > r[$1] ? $5 : r[$1])
    printf "%-15s wall %6.2f s  user %5.2f s  sys %5.2f s  rss %7.1f MiB\n", $1, $2, $3, $4, $5 / 1024 }
  END {
    print "medians (wall, CPU = user + sys, GB/s of wall and of CPU, peak RSS):"
    for (k in n) {
      m = n[k]; for (i = 1; i <= m; i++) { ws[i] = w[k, i]; cs[i] = c[k, i] }
      asort(ws); asort(cs); mw = ws[int((m + 1) / 2)]; mc = cs[int((m + 1) / 2)]
      printf "%-15s %6.2f s  %5.2f s  %5.2f GB/s  %5.2f GB/s  %7.1f MiB\n", k, mw, mc, bytes / mw / 1e9, bytes / mc / 1e9, r[k] / 1024
    }
  }'
rm -f "$out"
