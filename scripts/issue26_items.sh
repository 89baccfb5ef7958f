#!/usr/bin/env bash
# Issue 26's reproductions, one line each: what BIN answers on the inputs the
# issue names (exit code, and the sentence or figure the item is about).
#   scripts/issue26_items.sh BIN [SHARED]   # SHARED: the shared/ folder (default ../shared)
# Run it with the binary before and after to fill the closing note's table.
set -u
cd "$(dirname "$0")/.."
bin=$1 shared=${2:-../shared}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
row() { printf '%s\t%s\n' "$1" "$2"; }
json() { python3 -c "import json,sys; d=json.load(sys.stdin); print($1)" 2>/dev/null; }

for f in summary_001 summary_013 summary_014; do
    "$bin" recommend "$shared/realtext/$f.txt" >"$tmp/out" 2>&1
    row "1 recommend $f" "exit $? · $(head -c 150 "$tmp/out" | head -1)"
done
for f in "$shared/snapshots/muduard-layoutediting_dump_snapshot.pickle" "$shared/realtext/oom_031.txt"; do
    "$bin" recommend "$f" >/dev/null 2>&1; r=$?
    "$bin" validate "$f" --conf expandable_segments:True >/dev/null 2>&1; v=$?
    row "1 nothing to replay $(basename "$f")" "recommend exit $r · validate exit $v"
done
"$bin" recommend fixtures/text/readme_example.log >"$tmp/out" 2>&1
row "2 recommend readme_example" "exit $? · 'nothing is recommended': $(grep -c 'nothing is recommended' "$tmp/out") · Recommended: $(grep -c '^Recommended' "$tmp/out")"
printf '%s\n' "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 5.83 GiB total capacity; 5.81 GiB already allocated; 2.72 MiB free; 5.81 GiB reserved in total by PyTorch)" >"$tmp/cap.log"
"$bin" validate "$tmp/cap.log" --conf max_split_size_mb:128 --format json >"$tmp/out" 2>/dev/null
row "2 validate 20 MiB on 5.83 GiB" "exit $? · candidate.oom $(json 'd["candidate"]["oom"] is not None' <"$tmp/out") · $(json 'd["verdict"][:110]' <"$tmp/out")"
"$bin" recommend "$shared/realtext/summary_001.txt" >"$tmp/out" 2>&1
row "2 summary without OOM" "'avoids the OOM': $(grep -c 'avoids the OOM' "$tmp/out")"
"$bin" recommend "$tmp/cap.log" 2>/dev/null | head -1 >"$tmp/out"
row "2 text header" "$(grep -o '([^)]*)' "$tmp/out" | head -1)"
"$bin" recommend "$shared/realtext/summary_001.txt" --format json >"$tmp/out" 2>/dev/null
row "3 recommend summary_001" "configs searched $(json 'len(d.get("candidates",[]))' <"$tmp/out") · expandable_segments among them: $(grep -c 'expandable_segments:True' "$tmp/out")"
"$bin" validate "$shared/realtext/summary_001.txt" --conf expandable_segments:True >/dev/null 2>&1
row "3 validate summary_001 expandable" "exit $?"
for f in yiyi-llm-inference_oom_snapshot magma27-assignment2-systems_memory_snapshot; do
    "$bin" validate "$shared/snapshots/$f.pickle" --conf expandable_segments:True --format json >"$tmp/out" 2>/dev/null
    row "4 validate $f" "exit $? · strength $(json 'd.get("strength")' <"$tmp/out")"
done
"$bin" recommend "$shared/snapshots/yiyi-llm-inference_oom_snapshot.pickle" >"$tmp/out" 2>&1
row "4 yiyi recommend" "exit $? · 'request of 0 B': $(grep -c 'request of 0 B' "$tmp/out")"
"$bin" recommend "$shared/realtext/oom_071.txt" --format json >"$tmp/out" 2>/dev/null
row "5 recommend oom_071" "exit $? · needs: $(json 'd["verdict"]' <"$tmp/out" | grep -o '[0-9.]* [GMT]iB' | tail -1) · bisection_replays $(json 'd["search"]["bisection_replays"]' <"$tmp/out")"
"$bin" diagnose fixtures/snapshots/gen-trace-empty-cache-unrecorded.pickle >"$tmp/out" 2>&1
row "6 empty_cache without stacks" "finding trace-empty-cache: $(grep -c '┆ trace-empty-cache' "$tmp/out")"
"$bin" diagnose fixtures/text/readme_example.log --report "$tmp/r.html" >/dev/null 2>&1
row "8 diagnose HTML" "'What to check next': $(cat "$tmp/r.html" 2>/dev/null | grep -c 'What to check next')"
row "8 limit defaults" "$("$bin" diagnose --help 2>&1 | grep -A12 'max-input-bytes' | grep -m1 -o '\[default: [^]]*')"
row "8 rules --help" "mentions --each: $("$bin" rules --help 2>&1 | grep -c -- '--each')"
row "9 binary" "$(stat -c %s "$bin") bytes · $(file -b "$bin" | grep -o 'not stripped\|stripped' | head -1)"
