#!/usr/bin/env python3
"""Two long traced snapshots of one workload at two sizes: the input of `fit`'s speed benchmark.

Tiles each of two real recordings of one series (fixtures/fit/, from shared/series) with
scripts/gen_tiled_snapshot.py until each holds about --entries trace entries:

    scripts/gen_fit_pair.py --entries 1000000 --series forward2.7b -o target/fitpair
    allocdoc fit target/fitpair/forward2.7b-128.pickle target/fitpair/forward2.7b-512.pickle \\
        --sizes 128,512 --capacity 40GiB --conf expandable_segments:True ...

--series forward2.7b: LINYUNLinYun's 2.7B forward at context 128 and 512 (the same calls in
the same order at both sizes: the common case). --series attn: sungdk0822's attention at 256
and 1024, whose recordings differ in every iteration (the 1024 one records an extra call per
iteration), so the two long traces are aligned window by window.
"""

import argparse
import lzma
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "..", "fixtures", "fit")
SERIES = {"forward2.7b": (128, 512), "attn": (256, 1024)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--entries", type=int, default=1_000_000)
    ap.add_argument("--series", choices=sorted(SERIES), default="forward2.7b")
    ap.add_argument("-o", "--output", required=True, help="a directory")
    a = ap.parse_args()
    os.makedirs(a.output, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for size in SERIES[a.series]:
            name = f"{a.series}-{size}.pickle"
            src = os.path.join(tmp, name)
            with lzma.open(os.path.join(FIXTURES, name + ".xz")) as f, open(src, "wb") as out:
                out.write(f.read())
            subprocess.run([sys.executable, os.path.join(HERE, "gen_tiled_snapshot.py"), "--entries",
                            str(a.entries), "--source", src, "-o", os.path.join(a.output, name)], check=True)


if __name__ == "__main__":
    main()
