#!/usr/bin/env python3
"""Write a traced `_snapshot()`-shaped pickle whose whole trace runs inside the segments the
snapshot holds (issue 34, item 2): no entry needs a cudaMalloc or a cudaFree under any config,
so a replay cannot tell the configs apart and no verdict on it may be "proven".

Two 20 MiB large-pool segments (cudaMalloc'd, not expandable), each with a 4 MiB tensor live
from before the trace; then 6 steps that each allocate 6 MiB, 3 MiB and 5 MiB in the cached
free space and free them again. Every request is under the smallest `max_split_size_mb` the
candidates try, so no config turns the cached blocks into oversize ones.

    scripts/gen_cached_only_snapshot.py -o fixtures/snapshots/gen-cached-only-trace.pickle

With --frees-first (issue 34, item 9), the trace begins with the `free_completed` of the first
segment's 4 MiB tensor, allocated before it (the ring buffer kept the free's completion, not
its request), and its steps then allocate 3 MiB at a time: allocated memory
peaks before the first entry (8 MiB live), never after it (at most 7 MiB).

    scripts/gen_cached_only_snapshot.py --frees-first -o fixtures/snapshots/gen-trace-frees-first.pickle

With --one-free (issue 41, item 3), the trace is one `segment_free` of a 20 MiB segment and
nothing else: no allocation, so every config makes the same single cudaFree and no verdict on it
may be "proven".

    scripts/gen_cached_only_snapshot.py --one-free -o fixtures/snapshots/gen-trace-one-free.pickle
"""

import argparse
import pickle

MIB = 1 << 20
SEG = 20 * MIB
STEP = {"filename": "/home/user/proj/train.py", "line": 41, "name": "step"}
FORWARD = [{"filename": "/home/user/proj/model.py", "line": 17, "name": "forward"}, STEP]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--frees-first", action="store_true", help="free a pre-trace tensor first, then 3 MiB steps")
    ap.add_argument("--one-free", action="store_true", help="a trace of one segment_free, no allocation")
    ap.add_argument("-o", "--output", required=True)
    a = ap.parse_args()
    if a.one_free:
        trace = [{"action": "segment_free", "addr": 0x7F2000000000, "size": SEG, "stream": 0,
                  "time_us": 1_700_000_000_000_025, "frames": FORWARD}]
        with open(a.output, "wb") as f:
            pickle.dump({"segments": [], "device_traces": [trace]}, f, protocol=4)
        return
    bases = [0x7F2000000000, 0x7F2000000000 + 32 * MIB]
    trace, t = [], [1_700_000_000_000_000]

    def entry(action, addr, size):
        t[0] += 25
        trace.append({"action": action, "addr": addr, "size": size, "stream": 0, "time_us": t[0], "frames": FORWARD})

    if a.frees_first:
        # The ring buffer kept the free's completion, not its request.
        entry("free_completed", bases[0], 4 * MIB)
    for _ in range(6):
        held = [(bases[0] + 4 * MIB, 6 * MIB), (bases[0] + 10 * MIB, 3 * MIB), (bases[1] + 4 * MIB, 5 * MIB)]
        if a.frees_first:
            held = [(bases[0], 3 * MIB)]
        for addr, size in held:
            entry("alloc", addr, size)
        for addr, size in held:
            entry("free_requested", addr, size)
            entry("free_completed", addr, size)
    segments = []
    for n, base in enumerate(bases):
        if a.frees_first and n == 0:
            segments.append({
                "device": 0, "address": base, "total_size": SEG, "stream": 0, "segment_type": "large",
                "segment_pool_id": (0, 0), "allocated_size": 0, "active_size": 0, "requested_size": 0,
                "is_expandable": False, "frames": [],
                "blocks": [{"address": base, "size": SEG, "requested_size": 0, "state": "inactive", "frames": []}],
            })
            continue
        segments.append({
            "device": 0, "address": base, "total_size": SEG, "stream": 0, "segment_type": "large",
            "segment_pool_id": (0, 0), "allocated_size": 4 * MIB, "active_size": 4 * MIB,
            "requested_size": 4 * MIB, "is_expandable": False, "frames": [],
            "blocks": [
                {"address": base, "size": 4 * MIB, "requested_size": 4 * MIB, "state": "active_allocated", "frames": FORWARD},
                {"address": base + 4 * MIB, "size": SEG - 4 * MIB, "requested_size": 0, "state": "inactive", "frames": []},
            ],
        })
    snap = {"segments": segments, "device_traces": [trace]}
    with open(a.output, "wb") as f:
        pickle.dump(snap, f, protocol=4)


if __name__ == "__main__":
    main()
