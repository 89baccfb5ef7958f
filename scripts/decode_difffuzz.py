#!/usr/bin/env python3
"""Two allocdoc builds on the same mutated snapshot pickles: any difference in exit code, standard
output or standard error is printed, and the input kept.

A change meant to leave behaviour alone (a faster decoder or trace pass) should give 0 differences:
each input is a snapshot fixture of at most --max-bytes with 1 to 6 mutations (a byte replaced, a
run deleted, bytes inserted, the tail cut), run through one of `parse --format json`,
`top --format json` and `diagnose`. An exit code outside 0-5 (a panic gives 101) is printed too.

    scripts/decode_difffuzz.py OLD_BIN NEW_BIN --seed 3 --count 8000
"""

import argparse
import glob
import os
import random
import subprocess
import tempfile

COMMANDS = (["parse", "--format", "json"], ["top", "--format", "json"], ["diagnose"])


def mutate(data, rng):
    for _ in range(rng.randint(1, 6)):
        if not data:
            break
        p, op = rng.randrange(len(data)), rng.random()
        if op < 0.4:
            data[p] = rng.randrange(256)
        elif op < 0.6:
            del data[p : p + rng.randint(1, 16)]
        elif op < 0.8:
            data[p:p] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        else:
            del data[p:]
    return data or bytearray(b"\x80\x04.")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--count", type=int, default=1000)
    ap.add_argument("--max-bytes", type=int, default=6_000_000)
    ap.add_argument("--keep", default=tempfile.gettempdir(), help="folder for the inputs that differ")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    sources = sorted(
        f for f in glob.glob("fixtures/snapshots/*.pickle") if os.path.getsize(f) <= args.max_bytes
    )
    differ = 0
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "input.pickle")
        for i in range(args.count):
            with open(rng.choice(sources), "rb") as f:
                data = mutate(bytearray(f.read()), rng)
            with open(path, "wb") as f:
                f.write(data)
            cmd = rng.choice(COMMANDS)
            old, new = (subprocess.run([b, *cmd, path], capture_output=True, timeout=120) for b in (args.old, args.new))
            if (old.returncode, old.stdout, old.stderr) != (new.returncode, new.stdout, new.stderr):
                differ += 1
                kept = os.path.join(args.keep, f"difffuzz-{args.seed}-{i}.pickle")
                with open(kept, "wb") as f:
                    f.write(data)
                print(f"differ: {' '.join(cmd)} {kept}: exit {old.returncode} against {new.returncode}")
            if new.returncode not in range(6):
                print(f"exit {new.returncode}: {' '.join(cmd)} (input {i})")
    print(f"{args.count} inputs, {differ} differ")


if __name__ == "__main__":
    main()
