#!/usr/bin/env bash
# Snapshot decoding, one run, one file: `allocdoc parse` (release) against
# Python's `pickle.load` with the garbage collector on (the default) and off.
# Wall time is the best of $RUNS runs; peak RSS is the largest "Maximum resident
# set size" /usr/bin/time -v reports over those runs.
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

# measure NAME CMD...: prints "NAME wall_s rss_mib" (best wall, max RSS).
measure() {
    local name=$1 best="" rss=0 log
    shift
    log=$(mktemp)
    for _ in $(seq "$RUNS"); do
        /usr/bin/time -v "$@" >/dev/null 2>"$log"
        local wall kb
        wall=$(awk -F': ' '/Elapsed \(wall clock\)/ {n=split($2,t,":"); s=0; for(i=1;i<=n;i++) s=s*60+t[i]; print s}' "$log")
        kb=$(awk -F': ' '/Maximum resident set size/ {print $2}' "$log")
        if [[ -z $best ]] || awk "BEGIN{exit !($wall < $best)}"; then best=$wall; fi
        if (( kb > rss )); then rss=$kb; fi
    done
    rm -f "$log"
    printf '%-28s %8.2f s %8.0f MiB\n' "$name" "$best" "$((rss / 1024))"
}

echo "input: $FILE ($(stat -c %s "$FILE") bytes), best of $RUNS, $(nproc) cores"
{
    measure "allocdoc parse" "$BIN" parse --format json "$FILE"
    measure "python pickle.load (gc on)" python3 -c "import pickle,sys; pickle.load(open(sys.argv[1],'rb'))" "$FILE"
    measure "python pickle.load (gc off)" python3 -c "import gc,pickle,sys; gc.disable(); pickle.load(open(sys.argv[1],'rb'))" "$FILE"
} | tee target/bench/pickle_bench.txt
awk '
    NR==1 {rs=$(NF-3); rm=$(NF-1)}
    NR==2 {g=$(NF-3); gm=$(NF-1)}
    NR==3 {n=$(NF-3)}
    END {printf "speed-up: %.1fx vs gc on, %.1fx vs gc off; RSS %.2f of Python\n", g/rs, n/rs, rm/gm}
' target/bench/pickle_bench.txt
