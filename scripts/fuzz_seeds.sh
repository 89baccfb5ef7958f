#!/usr/bin/env bash
# Writes the hostile seed inputs of the fuzz corpora into fuzz/seeds/<target>/:
# the shapes that once aborted or were misread (issue 14). cargo fuzz starts
# from them: `cargo +nightly fuzz run input fuzz/corpus/input fuzz/seeds/input`.
# Usage: scripts/fuzz_seeds.sh   (from the repository root; needs python3,
# gzip, xz, zstd, bzip2)
set -euo pipefail
cd "$(dirname "$0")/.."
seeds=fuzz/seeds
rm -rf "$seeds"
mkdir -p "$seeds/decode" "$seeds/input"
python3 - "$seeds" <<'PY'
import struct, sys
seeds = sys.argv[1]
def put(name, data, targets=("decode", "input")):
    for t in targets:
        open(f"{seeds}/{t}/{name}", "wb").write(data)

def shared(n):
    # {"segments": [seg]*n, "device_traces": [[]]}, seg["blocks"] = [blk]*n: n² blocks
    out = bytearray(b"\x80\x04}\x94")
    def s(x):
        out.extend(b"\x8c" + bytes([len(x)]) + x.encode())
    def dict_(items):
        out.extend(b"}(")
        for k, v in items:
            s(k); v()
        out.extend(b"u")
    dict_([("size", lambda: out.extend(b"J" + struct.pack("<i", 512))),
           ("state", lambda: s("active_allocated"))])
    out.extend(b"\x94" b"0")  # memo 1, pop
    dict_([("address", lambda: out.extend(b"J\0\0\0\0")),
           ("total_size", lambda: out.extend(b"J" + struct.pack("<i", 512 * n))),
           ("blocks", lambda: out.extend(b"](" + b"h\x01" * n + b"e"))])
    out.extend(b"\x94" b"0")  # memo 2, pop
    out.extend(b"(")
    s("segments"); out.extend(b"](" + b"h\x02" * n + b"e")
    s("device_traces"); out.extend(b"]]a")
    out.extend(b"u.")
    return bytes(out)

put("shared-100.pickle", shared(100))
put("shared-2000.pickle", shared(2000))
put("marks.pickle", b"\x80\x04" + b"(" * 70000)
put("dup.pickle", b"\x80\x04}" + b"2" * 5000 + b".")
put("nested.pickle", b"\x80\x04" + b"]" * 5000 + b"a" * 4999 + b".")
put("memo-index.pickle", b"\x80\x04}r\xff\xff\xff\xff0j\xff\xff\xff\xff.")
put("binunicode8.pickle", b"\x80\x04\x8d\xff\xff\xff\xff\xff\xff\xff\x7fabc.")
put("binbytes.pickle", b"\x80\x04B\xff\xff\xff\xffabc.")
put("frame.pickle", b"\x80\x04\x95\xff\xff\xff\xff\xff\xff\xff\xff}.")
# Floods of cheap opcodes that each cost the decoder many times their size (issue 27).
for name, unit in [("empty-lists", b"]"), ("empty-dicts", b"}"), ("empty-tuples", b")"),
                   ("mark-lists", b"(l"), ("mark-tuples", b"(Nt"), ("short-binunicode", b"\x8c\x01a"),
                   ("binunicode", b"X\x01\x00\x00\x00a"), ("short-binbytes", b"C\x01a")]:
    put(f"flood-{name}.pickle", b"\x80\x04" + unit * (8192 // len(unit)))
# The rest of issue 33's floods (tests/hostile.rs, 128 MiB each there), each also with a STOP.
for name, head, unit in [("empty-sets", b"", b"\x8f"), ("empty-short-binunicode", b"", b"\x8c\x00"),
                         ("empty-binunicode", b"", b"X\x00\x00\x00\x00"), ("nones", b"", b"N"),
                         ("dups", b"N", b"2"), ("memoize-object", b"]", b"\x94"),
                         ("memoize-none", b"N", b"\x94")]:
    body = b"\x80\x04" + head + unit * (8192 // len(unit))
    put(f"flood-{name}.pickle", body)
    put(f"flood-{name}-stop.pickle", body + b".")
puts = b"".join(b"r" + struct.pack("<I", i) for i in range(1, 1600))
put("flood-memo-puts-out-of-order.pickle", b"\x80\x04N" + puts)
put("flood-memo-puts-out-of-order-stop.pickle", b"\x80\x04N" + puts + b".")
put("flood-empty-lists-stop.pickle", b"\x80\x04" + b"]" * 8192 + b".")
put("p0-global.pickle", b"cos\nsystem\n(S'echo hi'\ntR.")
put("p1-global.pickle", b"cos\nsystem\nq\x00(X\x07\x00\x00\x00echo hiq\x01tq\x02Rq\x03.")
put("p0-inst.pickle", b"(S'echo hi'\nios\nsystem\n.")
put("p0-nested-global.pickle", b"(dp0\nS'segments'\np1\ncos\nsystem\np2\ns.")
put("p0-text-like.txt", b"cat\nfoo\nThis log has no evidence.\n")
PY
for f in fixtures/snapshots/gen-small-p0.pickle fixtures/snapshots/gen-small-p1.pickle \
         fixtures/snapshots/gen-small-p4.pickle; do
  b=$(basename "$f")
  head -c "$(( $(stat -c %s "$f") / 2 ))" "$f" > "$seeds/decode/half-$b"
  cp "$seeds/decode/half-$b" "$seeds/input/half-$b"
  gzip -c "$f" > "$seeds/input/$b.gz"
done
for f in fixtures/text/constructed_2_4_every_clause.log fixtures/text/constructed_summary_2x_full.log \
         fixtures/text/constructed_stats_ordereddict.log; do
  [ -f "$f" ] || continue
  b=$(basename "$f")
  gzip -c "$f" > "$seeds/input/$b.gz"
  xz -c "$f" > "$seeds/input/$b.xz"
  zstd -q -c "$f" > "$seeds/input/$b.zst"
  bzip2 -c "$f" > "$seeds/input/$b.bz2"
  printf '\xff\xfe' > "$seeds/input/$b.u16le"
  iconv -f UTF-8 -t UTF-16LE "$f" >> "$seeds/input/$b.u16le"
  iconv -f UTF-8 -t UTF-16BE "$f" > "$seeds/input/$b.u16be-nobom"
  printf '\xef\xbb\xbf' | cat - "$f" > "$seeds/input/$b.bom"
  head -c 100 "$seeds/input/$b.gz" > "$seeds/input/$b.cut.gz"
done
printf 'action,id,size,stream\nalloc,1,1024,0\nfree,1,,0\n' | gzip -c > "$seeds/input/trace.csv.gz"
printf 'PK\003\004rest of a zip' > "$seeds/input/archive.zip"
ls "$seeds"/* | wc -l
