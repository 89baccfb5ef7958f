#!/usr/bin/env bash
# BENCHMARKS.md, "Batch diagnosis": `diagnose --each --format jsonl` over N small
# logs (scripts/gen_small_logs.py) against a shell loop of single `diagnose`
# calls, interleaved; wall and CPU (user+sys) per run, files per second.
#   scripts/each_bench.sh [N]        (default 10000; BIN=target/release/allocdoc)
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-10000}
BIN=${BIN:-target/release/allocdoc}
DIR=${DIR:-/tmp/allocdoc-each-bench-$N}
[ -d "$DIR" ] || python3 scripts/gen_small_logs.py "$DIR" "$N" > /dev/null
mapfile -t FILES < <(find "$DIR" -type f | LC_ALL=C sort)
echo "$(nproc) cores, $N files ($(du -sh "$DIR" | cut -f1)), $BIN"
TIMEFORMAT="%R %U %S"
run() {  # label, command...: prints label, wall, cpu, files/s
  local label=$1; shift
  local t; t=$( { time "$@" > /dev/null 2>&1; } 2>&1 )
  read -r wall user sys <<< "$t"
  awk -v l="$label" -v w="$wall" -v u="$user" -v s="$sys" -v n="$N" \
    'BEGIN { printf "%-28s wall %7.2f s  cpu %7.2f s  %9.0f files/s\n", l, w, u + s, n / w }'
}
each() { "$BIN" diagnose --each --format jsonl "$DIR"; }
each1() { RAYON_NUM_THREADS=1 "$BIN" diagnose --each --format jsonl "$DIR"; }
loop() { for f in "${FILES[@]}"; do "$BIN" diagnose --format json "$f" || true; done; }
for round in 1 2 3; do
  run "diagnose --each (2 threads)" each
  run "diagnose --each (1 thread)" each1
  [ "$round" = 2 ] && run "shell loop of diagnose" loop
done
echo "jsonl lines: $("$BIN" diagnose --each --format jsonl "$DIR" | wc -l)"
