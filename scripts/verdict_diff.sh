#!/usr/bin/env bash
# Runs `validate --conf expandable_segments:True` and `recommend` (JSON, exit
# code) on every fixture with a binary, or compares two such runs.
#   scripts/verdict_diff.sh run BIN OUTDIR     # OUTDIR/<cmd>/<fixture>.json and .rc
#   scripts/verdict_diff.sh diff OLDDIR NEWDIR # which outputs changed, and how
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
    old=$2 new=$3
    for cmd in validate recommend; do
        same=0 changed=0
        for o in "$old/$cmd"/*.json; do
            n="$new/$cmd/$(basename "$o")"
            rc_o=$(cat "${o%.json}.rc") rc_n=$(cat "${n%.json}.rc" 2>/dev/null)
            if cmp -s "$o" "$n" && [ "$rc_o" = "$rc_n" ]; then
                same=$((same + 1))
            else
                changed=$((changed + 1))
                echo "== $cmd $(basename "$o" .json): exit $rc_o -> $rc_n"
                python3 - "$o" "$n" <<'PY'
import json, sys
def load(p):
    try:
        return json.load(open(p))
    except Exception:
        return None
def flat(v, pre=""):
    if isinstance(v, dict):
        for k, x in v.items():
            yield from flat(x, f"{pre}.{k}" if pre else k)
    elif isinstance(v, list):
        for i, x in enumerate(v):
            yield from flat(x, f"{pre}[{i}]")
    else:
        yield pre, v
a, b = load(sys.argv[1]), load(sys.argv[2])
fa = dict(flat(a)) if a is not None else {}
fb = dict(flat(b)) if b is not None else {}
keys = sorted(set(fa) | set(fb))
shown = 0
for k in keys:
    if fa.get(k, "<absent>") != fb.get(k, "<absent>"):
        if shown < 12:
            print(f"  {k}: {str(fa.get(k, '<absent>'))[:160]!s} -> {str(fb.get(k, '<absent>'))[:160]!s}")
        shown += 1
if shown > 12:
    print(f"  … {shown - 12} more fields")
PY
            fi
        done
        echo "$cmd: $same unchanged, $changed changed"
    done
    ;;
*)
    echo "usage: $0 run BIN OUTDIR | diff OLDDIR NEWDIR" >&2
    exit 2
    ;;
esac
