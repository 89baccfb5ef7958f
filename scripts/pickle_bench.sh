#!/usr/bin/env bash
# Snapshot decoding, one run, one file: `allocdoc parse` (release) against
# Python's `pickle.load` with the garbage collector on (the default) and off.
# Wall time and CPU time (user + system) are the best of $RUNS runs each; peak
# RSS is the largest "Maximum resident set size" /usr/bin/time -v reports. On a
# shared machine CPU time is the fairer comparison (wall time counts waiting).
#
#   scripts/pickle_bench.sh [SNAPSHOT]     (default: a ~200 MB generated one)
#
# The default input is written by scripts/gen_snapshot.py into target/bench/.
set -euo pipefail
cd "$(dirname "$0")/.."

RUNS=${RUNS:-3}
FILE=${1:-target/bench/snap-200mb.pickle}
if [[ ! -f $FILE ]]; then
    mkdir -p "$(dirname "$FILE")"
    python3 scripts/gen_snapshot.py --blocks 1850000 --trace 1850000 -o "$FILE"
fi
cargo build --release --quiet
BIN=target/release/allocdoc

# measure NAME CMD...: prints "NAME wall_s cpu_s rss_mib" (best wall, best
# CPU, max RSS).
measure() {
    local name=$1 best="" cpu_best="" rss=0 log
    shift
    log=$(mktemp)
    for _ in $(seq "$RUNS"); do
        /usr/bin/time -v "$@" >/dev/null 2>"$log"
        local wall cpu kb
        wall=$(awk -F': ' '/Elapsed \(wall clock\)/ {n=split($2,t,":"); s=0; for(i=1;i<=n;i++) s=s*60+t[i]; print s}' "$log")
        cpu=$(awk -F': ' '/User time|System time/ {s+=$2} END {print s}' "$log")
        kb=$(awk -F': ' '/Maximum resident set size/ {print $2}' "$log")
        if [[ -z $best ]] || awk "BEGIN{exit !($wall < $best)}"; then best=$wall; fi
        if [[ -z $cpu_best ]] || awk "BEGIN{exit !($cpu < $cpu_best)}"; then cpu_best=$cpu; fi
        if (( kb > rss )); then rss=$kb; fi
    done
    rm -f "$log"
    printf '%-28s %8.2f s wall %8.2f s cpu %8.0f MiB\n' "$name" "$best" "$cpu_best" "$((rss / 1024))"
}

echo "input: $FILE ($(stat -c %s "$FILE") bytes), best of $RUNS, $(nproc) cores"
{
    measure "allocdoc parse" "$BIN" parse --format json "$FILE"
    measure "python pickle.load (gc on)" python3 -c "import pickle,sys; pickle.load(open(sys.argv[1],'rb'))" "$FILE"
    measure "python pickle.load (gc off)" python3 -c "import gc,pickle,sys; gc.disable(); pickle.load(open(sys.argv[1],'rb'))" "$FILE"
} | tee target/bench/pickle_bench.txt
# Fields from the end: MiB rss s cpu s wall.
awk '
    {wall[NR]=$(NF-7); cpu[NR]=$(NF-4); rss[NR]=$(NF-1)}
    END {
        printf "wall: %.1fx faster than gc on, %.1fx than gc off\n", wall[2]/wall[1], wall[3]/wall[1]
        printf "cpu:  %.1fx faster than gc on, %.1fx than gc off\n", cpu[2]/cpu[1], cpu[3]/cpu[1]
        printf "peak RSS: %.2f of Python gc on, %.2f of gc off\n", rss[1]/rss[2], rss[1]/rss[3]
    }
' target/bench/pickle_bench.txt
