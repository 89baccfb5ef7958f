#!/usr/bin/env bash
# `allocdoc diagnose` of one input by two binaries, side by side: RUNS rounds,
# each running A then B, so both see the same machine load. Prints each run
# (wall, user + system CPU, peak RSS) and the medians; on a shared machine the
# CPU times are the figure to compare.
#
#   scripts/diagnose_ab.sh BIN_A BIN_B [INPUT]     (RUNS=8 by default)
#
# The default input is the ~200 MB generated snapshot of scripts/pickle_bench.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

A=${1:?first binary}
B=${2:?second binary}
FILE=${3:-target/bench/snap-200mb.pickle}
RUNS=${RUNS:-8}
if [[ ! -f $FILE ]]; then
    mkdir -p "$(dirname "$FILE")"
    python3 scripts/gen_snapshot.py --blocks 1850000 --trace 1850000 -o "$FILE"
fi

log=$(mktemp)
trap 'rm -f "$log"' EXIT
for _ in $(seq "$RUNS"); do
    for bin in "$A" "$B"; do
        /usr/bin/time -f "$bin %e %U %S %M" "$bin" diagnose "$FILE" >/dev/null 2>>"$log"
    done
done
echo "input: $FILE ($(stat -c %s "$FILE") bytes), $RUNS rounds, $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
awk '{printf "%-40s wall %6.2f s  cpu %6.2f s  rss %5d MiB\n", $1, $2, $3 + $4, $5 / 1024}' "$log"
# Medians per binary: wall, CPU.
awk '{print $1, $2, $3 + $4}' "$log" | sort -k1,1 -k3n | awk '
    { bin[NR] = $1; wall[$1, ++n[$1]] = $2; cpu[$1, n[$1]] = $3 }
    END {
        for (b in n) {
            k = int((n[b] + 1) / 2)
            # CPU list is sorted; sort wall separately by selection.
            m = n[b]; for (i = 1; i <= m; i++) w[i] = wall[b, i]
            for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++) if (w[j] < w[i]) { t = w[i]; w[i] = w[j]; w[j] = t }
            printf "median %-33s wall %6.2f s  cpu %6.2f s\n", b, w[k], cpu[b, k]
            med[b] = cpu[b, k]
        }
    }'
