#!/usr/bin/env bash
# Runs `validate --conf expandable_segments:True` and `recommend` (JSON, exit
# code) on every fixture with a binary, or compares two such runs.
#   scripts/verdict_diff.sh run BIN OUTDIR     # OUTDIR/<cmd>/<fixture>.json and .rc
#   scripts/verdict_diff.sh diff OLDDIR NEWDIR # which outputs changed, how, and why
#                                              (scripts/verdict_causes.py)
# Used for issue 26's closing note: JSON unchanged wherever no item applies.
set -u
cd "$(dirname "$0")/.."
case "${1:-}" in
run)
    bin=$2 out=$3
    mkdir -p "$out/validate" "$out/recommend"
    find fixtures/text fixtures/validate fixtures/snapshots fixtures/eval fixtures/allocator \
        fixtures/report /work/shared/realtext /work/shared/snapshots -type f \
        ! -name '*.md' ! -name '*.json' 2>/dev/null | sort | while read -r f; do
        name=$(echo "$f" | sed 's#^/work/shared/#shared_#; s#/#_#g')
        timeout 120 "$bin" validate "$f" --conf expandable_segments:True --format json \
            >"$out/validate/$name.json" 2>/dev/null
        echo $? >"$out/validate/$name.rc"
        timeout 300 "$bin" recommend "$f" --format json >"$out/recommend/$name.json" 2>/dev/null
        echo $? >"$out/recommend/$name.rc"
    done
    ;;
diff)
    exec python3 scripts/verdict_causes.py "$2" "$3"
    ;;
*)
    echo "usage: $0 run BIN OUTDIR | diff OLDDIR NEWDIR" >&2
    exit 2
    ;;
esac
