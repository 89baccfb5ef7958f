#!/usr/bin/env python3
"""Write a traced `_snapshot()`-shaped pickle of one forward pass through 24 layers (issue 41,
item 3): each layer allocates its attention scores (freed before the next layer) and an activation
saved for backward (kept), so allocated memory cycles once per layer and what the layers save
rises at every cycle; at the end of the pass the saved activations are freed and nothing is live
but the weights (two 2.5 GiB segments live from before the trace). The cycles are layers of one
step, not steps: nothing grows from step to step.

    scripts/gen_layer_loop_snapshot.py -o fixtures/snapshots/gen-layer-loop-forward.pickle
"""

import argparse
import pickle

MIB = 1 << 20
GIB = 1 << 30
STEP = {"filename": "/home/user/proj/bench.py", "line": 88, "name": "run_forward"}


def frames(line, name):
    return [{"filename": "/home/user/proj/model.py", "line": line, "name": name}, STEP]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-o", "--output", required=True)
    a = ap.parse_args()
    weights = [0x7F0000000000, 0x7F0000000000 + 4 * GIB]
    trace, t = [], [1_700_000_000_000_000]
    addr = [0x7E0000000000]

    def entry(action, at, size, f):
        t[0] += 40
        trace.append({"action": action, "addr": at, "size": size, "stream": 0, "time_us": t[0], "frames": f})

    def alloc(size, f):
        addr[0] += 1 << 32
        entry("alloc", addr[0], size, f)
        return addr[0], size, f

    def free(block):
        entry("free_requested", *block)
        entry("free_completed", *block)

    saved = []
    for _ in range(24):
        q = alloc(64 * MIB, frames(120, "forward"))
        scores = alloc(4 * GIB, frames(133, "scaled_dot_product_attention"))
        out = alloc(16 * MIB, frames(140, "forward"))
        free(scores)
        free(q)
        saved.append(out)
    for block in saved:
        free(block)
    segments = [{
        "device": 0, "address": base, "total_size": 5 * GIB // 2, "stream": 0, "segment_type": "large",
        "segment_pool_id": (0, 0), "allocated_size": 5 * GIB // 2, "active_size": 5 * GIB // 2,
        "requested_size": 5 * GIB // 2, "is_expandable": False, "frames": [],
        "blocks": [{"address": base, "size": 5 * GIB // 2, "requested_size": 5 * GIB // 2,
                    "state": "active_allocated", "frames": frames(30, "__init__")}],
    } for base in weights]
    with open(a.output, "wb") as f:
        pickle.dump({"segments": segments, "device_traces": [trace]}, f, protocol=4)


if __name__ == "__main__":
    main()
