#!/usr/bin/env python3
"""Whole-process `allocdoc replay TRACE` of several binaries, interleaved
round by round so that the VM's speed swings hit every binary alike (issue
15's replay figure, before against after, in one run). Wall time from
time.monotonic(); prints the median, the mean of the fastest half and the
fastest run, and events/s of the median.

usage: scripts/replay_pairs.py ROUNDS TRACE BIN [BIN ...]
  TRACE: python3 ../shared/bench/gen_trace.py trace_1m.csv 1000000
Copy each BIN first (cp target/release/allocdoc /tmp/allocdoc_after).
"""
import statistics
import subprocess
import sys
import time


def events_in(trace):
    with open(trace, "rb") as f:
        # One event a line after the header (the generator writes no comments).
        return sum(1 for _ in f) - 1


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    rounds, trace, bins = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
    events = events_in(trace)
    walls = {b: [] for b in bins}
    for _ in range(rounds):
        for b in bins:
            start = time.monotonic()
            subprocess.run([b, "replay", trace], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, check=True)
            walls[b].append(time.monotonic() - start)
    for b, w in walls.items():
        w.sort()
        half = w[: max(1, len(w) // 2)]
        median = statistics.median(w)
        print(f"{b:28} median {median:.4f} s  fastest half {sum(half) / len(half):.4f} s  "
              f"fastest {w[0]:.4f} s  {events / median / 1e6:.2f} M events/s (median)")


if __name__ == "__main__":
    main()
