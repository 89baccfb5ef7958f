#!/usr/bin/env bash
# Runs every command of the release binary on every kind of input (fixtures,
# real snapshots, hostile files, odd configs) and reports each run that breaks
# shared/spec/cli-contract.md: a panic (exit 101), an exit code outside the
# command's allowed set, output on stdout when the command failed, a failure
# with nothing on stderr, or JSON output that does not parse.
#
#   bash scripts/cli_sweep.sh            # uses target/release/allocdoc
#   ALLOCDOC=path/to/allocdoc bash scripts/cli_sweep.sh
#
# Exit status: 0 when every run kept the contract, 1 otherwise.
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=${ALLOCDOC:-target/release/allocdoc}
[ -x "$BIN" ] || { echo "no binary at $BIN (cargo build --release)" >&2; exit 2; }
SHARED=${ALLOCDOC_SHARED:-/work/shared}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

runs=0
bad=0
report() { bad=$((bad + 1)); echo "FAIL [$1] $2"; }

# check ALLOWED_CODES LABEL STDIN_FILE -- ARGS...: run once, judge the result.
check() {
    local allowed=$1 label=$2 stdin=$3
    shift 4
    runs=$((runs + 1))
    timeout 60 "$BIN" "$@" <"$stdin" >"$tmp/out" 2>"$tmp/err"
    local rc=$?
    if [ $rc -eq 124 ]; then report "$label" "timed out after 60 s"; return; fi
    if [ $rc -eq 101 ] || grep -q "panicked at" "$tmp/err"; then
        report "$label" "PANIC rc=$rc: $(grep -m1 'panicked at' -A1 "$tmp/err" | tr '\n' ' ')"
        return
    fi
    case " $allowed " in
        *" $rc "*) ;;
        *) report "$label" "exit $rc not in {$allowed}: $(head -c 200 "$tmp/err")" ;;
    esac
    # 2 and 3 are errors; 4 (uncertain) and 5 (nothing to replay) are verdicts,
    # printed on stdout like 0 and 1 (README, "Exit codes").
    if [ $rc -eq 2 ] || [ $rc -eq 3 ]; then
        [ -s "$tmp/out" ] && report "$label" "exit $rc with $(wc -c <"$tmp/out") bytes on stdout"
        [ -s "$tmp/err" ] || report "$label" "exit $rc with nothing on stderr"
        # The contract's error message names the file (or standard input).
        grep -q "allocdoc: error: \|^error: \|usage:\|Usage:" "$tmp/err" ||
            report "$label" "exit $rc without an error line: $(head -c 200 "$tmp/err")"
    fi
    if [ $rc -ne 2 ] && [ $rc -ne 3 ] && [[ " $* " == *" --format json "* ]] && [ -s "$tmp/out" ]; then
        python3 -c 'import json,sys; json.load(open(sys.argv[1]))' "$tmp/out" 2>/dev/null ||
            report "$label" "--format json output does not parse"
    fi
}

# Inputs that must parse (exit 0) and hostile ones (exit 0 or 2, never a panic).
good=()
for f in fixtures/text/* fixtures/eval/* fixtures/report/* fixtures/validate/* \
         fixtures/allocator/*.txt fixtures/allocator/*.csv \
         fixtures/snapshots/*.pickle fixtures/snapshots/*.pkl \
         "$SHARED"/snapshots/*.pickle "$SHARED"/snapshots/*.pkl "$SHARED"/realtext/*.txt; do
    [ -f "$f" ] && good+=("$f")
done

mkdir -p "$tmp/dir" "$tmp/rules_bad"
: >"$tmp/empty"
head -c 100000 /dev/urandom >"$tmp/random.bin"
printf 'CUDA out of memory. Tried to allocate \xff\xfe 2.00 GiB \xc3\x28 GPU 0\n' >"$tmp/invalid_utf8.log"
python3 - "$tmp" <<'PY'
import sys, os
d = sys.argv[1]
# one 8 MiB line, and an OOM message buried at the end of a 1 MiB line
open(os.path.join(d, "huge_line.log"), "w").write("x" * (8 << 20) + "\n")
open(os.path.join(d, "huge_oom_line.log"), "w").write(
    "y" * (1 << 20) + " torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. "
    "GPU 0 has a total capacity of 79.11 GiB of which 1.19 GiB is free.\n")
# a pickle header then garbage, a pickle cut short, a 1-byte pickle opcode
open(os.path.join(d, "bad.pickle"), "wb").write(b"\x80\x04\x95" + os.urandom(4000))
open(os.path.join(d, "cut.pickle"), "wb").write(b"\x80\x04\x95\xff\xff\xff\xff\xff\xff\xff\x7f}")
open(os.path.join(d, "only_proto.pickle"), "wb").write(b"\x80")
# a trace CSV with a bad row, one with a huge size, a header only
open(os.path.join(d, "bad_trace.csv"), "w").write("action,id,size,stream\nalloc,a,abc,0\n")
open(os.path.join(d, "huge_trace.csv"), "w").write("action,id,size,stream\nalloc,a,99999999999999999999999,0\n")
open(os.path.join(d, "header_only.csv"), "w").write("action,id,size,stream\n")
# a summary table with nothing but borders; numbers that overflow u64
open(os.path.join(d, "borders.log"), "w").write("|" + "=" * 75 + "|\n" * 40)
open(os.path.join(d, "overflow.log"), "w").write(
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 99999999999999999999999.00 GiB. "
    "GPU 18446744073709551616 has a total capacity of 1e308 GiB of which -5 GiB is free.\n")
# NUL bytes and lone CRs
open(os.path.join(d, "nul.log"), "wb").write(b"\x00" * 1000 + b"CUDA out of memory.\r\r\x00Tried to allocate 1 GiB\r")
PY
printf 'id: [broken\n  - : :\n' >"$tmp/rules_bad/bad.yaml"
hostile=("$tmp/empty" /dev/null "$tmp/dir" "$tmp/missing.log" "$tmp/random.bin"
         "$tmp/invalid_utf8.log" "$tmp/huge_line.log" "$tmp/huge_oom_line.log"
         "$tmp/bad.pickle" "$tmp/cut.pickle" "$tmp/only_proto.pickle"
         "$tmp/bad_trace.csv" "$tmp/huge_trace.csv" "$tmp/header_only.csv"
         "$tmp/borders.log" "$tmp/overflow.log" "$tmp/nul.log")

for fmt in text json markdown; do
    for f in "${good[@]}"; do
        for cmd in parse diagnose; do
            check "0" "$cmd $fmt $f" /dev/null -- "$cmd" --format "$fmt" "$f"
        done
    done
    for f in "${hostile[@]}"; do
        for cmd in parse diagnose; do
            check "0 2" "$cmd $fmt $(basename "$f")" /dev/null -- "$cmd" --format "$fmt" "$f"
        done
    done
    # standard input: `-`, no path, empty, random bytes, a real log
    for cmd in parse diagnose; do
        check "0" "$cmd $fmt stdin -" fixtures/text/readme_example.log -- "$cmd" --format "$fmt" -
        check "0" "$cmd $fmt stdin implicit" fixtures/text/readme_example.log -- "$cmd" --format "$fmt"
        check "0 2" "$cmd $fmt stdin empty" "$tmp/empty" -- "$cmd" --format "$fmt"
        check "0 2" "$cmd $fmt stdin random" "$tmp/random.bin" -- "$cmd" --format "$fmt" -
        check "0 2" "$cmd $fmt two stdins" fixtures/text/readme_example.log -- "$cmd" --format "$fmt" - -
        check "0" "$cmd $fmt mixed inputs" /dev/null -- "$cmd" --format "$fmt" \
            fixtures/text/readme_example.log fixtures/snapshots/gen-small-plain.pickle
    done
    check "2" "diagnose $fmt bad --torch-version" /dev/null -- diagnose --format "$fmt" --torch-version banana fixtures/text/readme_example.log
    check "0" "diagnose $fmt odd --conf" /dev/null -- diagnose --format "$fmt" --conf '[[[' fixtures/text/readme_example.log
    check "2" "diagnose $fmt bad --rules dir" /dev/null -- diagnose --format "$fmt" --rules "$tmp/rules_bad" fixtures/text/readme_example.log
    check "2" "diagnose $fmt missing --rules dir" /dev/null -- diagnose --format "$fmt" --rules "$tmp/nowhere" fixtures/text/readme_example.log
    check "2" "diagnose $fmt unwritable --report" /dev/null -- diagnose --format "$fmt" --report "$tmp/dir" fixtures/text/readme_example.log

    # conf check: valid (0), invalid (1), bad version (2)
    nested=$(python3 -c 'print("roundup_power2_divisions:" + "[" * 200 + "]" * 200)')
    long=$(python3 -c 'print("max_split_size_mb:" + "9" * 5000)')
    longkey=$(python3 -c 'print("k" * 100000 + ":1")')
    for conf in '' ' ' 'expandable_segments:True' 'max_split_size_mb:128,expandable_segments:True' \
                'ünïcödé:Trüe' '[' ':' ',,,' ':::' '[,]' ']' 'max_split_size_mb:' 'max_split_size_mb:-1' \
                'max_split_size_mb:1e9' 'max_split_size_mb:18446744073709551616' \
                'roundup_power2_divisions:[256:1,512:2,>:8]' 'roundup_power2_divisions:[' \
                'roundup_power2_divisions:[>:]' 'roundup_power2_divisions:[1:2:3]' \
                'garbage_collection_threshold:0.5' 'garbage_collection_threshold:nan' \
                'backend:cudaMallocAsync' 'backend:' $'expandable_segments:True\n' $'\t' \
                "$nested" "$long" "$longkey"; do
        check "0 1" "conf check $fmt '${conf:0:40}'" /dev/null -- conf check --format "$fmt" "$conf"
    done
    for v in 2.4 2.10 1.10 1.13.1 2.5.1+cu121 2.6.0a0+git1234 99.99 0 '' ' ' banana 2 2. .2 -1 \
             1.2.3.4.5 '2.4 ' 99999999999999999999.1 v2.4; do
        check "0 1 2" "conf check $fmt --torch-version '$v'" /dev/null -- conf check --format "$fmt" expandable_segments:True --torch-version "$v"
    done

    check "0" "rules list $fmt" /dev/null -- rules list --format "$fmt"
    check "0" "rules show $fmt reserved-gap" /dev/null -- rules show --format "$fmt" "$(
        "$BIN" rules list --format json 2>/dev/null | python3 -c 'import json,sys; d=json.load(sys.stdin); r=d if isinstance(d,list) else d.get("rules",[]); print(r[0]["id"] if r else "x")' 2>/dev/null)"
    check "2" "rules show $fmt unknown" /dev/null -- rules show --format "$fmt" no-such-rule
    check "2" "rules show $fmt empty id" /dev/null -- rules show --format "$fmt" ''
    check "0" "rules test $fmt" /dev/null -- rules test --format "$fmt"
    check "2" "rules test $fmt bad yaml dir" /dev/null -- rules test --format "$fmt" "$tmp/rules_bad"
    check "2" "rules test $fmt missing dir" /dev/null -- rules test --format "$fmt" "$tmp/nowhere"
    check "0 1 2" "rules test $fmt empty dir" /dev/null -- rules test --format "$fmt" "$tmp/dir"
    check "2" "rules test $fmt a file" /dev/null -- rules test --format "$fmt" fixtures/text/readme_example.log
done

# Other commands on the hostile inputs: never a panic, codes within the contract.
for f in "${hostile[@]}"; do
    check "0 1 2" "replay $(basename "$f")" /dev/null -- replay "$f" --capacity 1GiB
    check "0 1 2 4 5" "recommend $(basename "$f")" /dev/null -- recommend "$f" --capacity 1GiB
    check "0 1 2 4 5" "validate $(basename "$f")" /dev/null -- validate "$f" --conf expandable_segments:True --capacity 1GiB
done
check "0 1 2" "replay --capacity 0" /dev/null -- replay fixtures/validate/interleaved_16mib.csv --capacity 0
for cap in -1 1e400GiB 99999999999TiB abc ''; do
    check "2" "replay --capacity '$cap'" /dev/null -- replay fixtures/validate/interleaved_16mib.csv --capacity "$cap"
done
check "0 1 2" "replay odd --conf" /dev/null -- replay fixtures/validate/interleaved_16mib.csv --conf '[' --capacity 1GiB
check "3 2" "replay --device cuda:99" /dev/null -- replay fixtures/validate/interleaved_16mib.csv --device cuda:99
check "2" "replay --device bogus" /dev/null -- replay fixtures/validate/interleaved_16mib.csv --device bogus

# Usage errors and help.
check "2" "no command" /dev/null --
check "2" "unknown command" /dev/null -- frobnicate
check "2" "unknown flag" /dev/null -- parse --frobnicate
check "2" "bad --format" /dev/null -- parse --format yaml fixtures/text/readme_example.log
for c in "" diagnose parse conf "conf check" replay recommend validate rules "rules list" "rules show" "rules test"; do
    # shellcheck disable=SC2086
    check "0" "help $c" /dev/null -- $c --help
    # shellcheck disable=SC2086
    "$BIN" $c --help 2>/dev/null | grep -q "Example" || report "help $c" "no example in --help"
done

echo "cli_sweep: $runs runs, $bad contract breaks"
[ $bad -eq 0 ]
