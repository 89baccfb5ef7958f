#!/usr/bin/env python3
"""The input of `forecast`'s speed benchmark: a 10,000-step run whose step makes about 10,000
allocations, from two real recordings tiled (scripts/gen_fit_pair.py) and a run of sizes drawn
as shared/forecast/README.md's "bucketed" runs draw them (probability proportional to 1/size,
seeded), over the recorded sizes and three above them.

    scripts/gen_forecast_bench.py -o target/forecast-bench
    allocdoc forecast target/forecast-bench/forward2.7b-128.pickle \\
        target/forecast-bench/forward2.7b-512.pickle --sizes 128,512 \\
        --run target/forecast-bench/run.txt --capacity 18GiB --conf expandable_segments:True \\
        --conf max_split_size_mb:128 --conf max_split_size_mb:512 \\
        --conf garbage_collection_threshold:0.8 --conf roundup_power2_divisions:4 --format json

--series forward2.7b (the default): LINYUNLinYun's 2.7B forward at context 128 and 512, tiled to
about 20,000 trace entries (about 10,200 allocations) each.
"""

import argparse
import os
import random
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SIZES = {"forward2.7b": [128, 256, 512, 1024, 2048], "attn": [256, 512, 1024, 2048, 4096]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=10_000)
    ap.add_argument("--entries", type=int, default=20_000, help="trace entries per recording")
    ap.add_argument("--series", choices=sorted(SIZES), default="forward2.7b")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("-o", "--output", required=True, help="a directory")
    a = ap.parse_args()
    os.makedirs(a.output, exist_ok=True)
    subprocess.run([sys.executable, os.path.join(HERE, "gen_fit_pair.py"), "--entries", str(a.entries),
                    "--series", a.series, "-o", a.output], check=True)
    sizes = SIZES[a.series]
    rng = random.Random(a.seed)
    run = rng.choices(sizes, weights=[1 / s for s in sizes], k=a.steps)
    path = os.path.join(a.output, "run.txt")
    with open(path, "w") as f:
        f.write(f"# {a.series}: {a.steps} steps drawn from {sizes} with weights 1/size, seed {a.seed}\n")
        f.writelines(f"{z}\n" for z in run)
    print(f"{path}: {a.steps} steps, " + ", ".join(f"{z}: {run.count(z)}" for z in sizes), file=sys.stderr)


if __name__ == "__main__":
    main()
