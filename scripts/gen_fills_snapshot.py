#!/usr/bin/env python3
"""Write a small `_snapshot()`-shaped pickle of a training run that runs out of memory, with
Python stacks that name what each allocation is (for `allocdoc top`'s categories and
"What must go"): the model built and moved to the GPU (parameters), one step of forward
(activations), backward (gradients kept, temporaries freed), AdamW's first step (its state
kept, its temporaries freed), then a second forward that grows until a request fails.

Every allocation gets a segment of its own (cudaMalloc'd just before it, a `segment_alloc`
entry), so the end state's segments are exactly the live blocks at the OOM. Sizes are chosen
so each category's bytes are known:

    parameters 4 x 64 MiB, gradients 4 x 64 MiB, optimizer state 8 x 64 MiB,
    activations of the second forward 6 x 96 MiB live at the OOM (1600 MiB in all, every
    segment full), then a request of 1 GiB with 180 MiB free on the device: 844 MiB must go.

    scripts/gen_fills_snapshot.py -o fixtures/snapshots/gen-fills-capacity-oom.pickle
"""

import argparse
import pickle

MIB = 1 << 20
SP = "/home/user/venv/lib/python3.11/site-packages/"


def frame(filename, line, name):
    return {"filename": filename, "line": line, "name": name}


TRAIN = frame("/home/user/proj/train.py", 40, "main")
BUILD = [frame(SP + "torch/nn/modules/module.py", 1340, "_apply"), frame(SP + "torch/nn/modules/module.py", 1355, "to"), frame("/home/user/proj/train.py", 21, "main")]
FORWARD = [frame("/home/user/proj/model.py", 57, "forward"), frame(SP + "torch/nn/modules/module.py", 1747, "_call_impl"), frame(SP + "torch/nn/modules/module.py", 1736, "_wrapped_call_impl"), TRAIN]
BACKWARD = [frame(SP + "torch/autograd/graph.py", 825, "_engine_run_backward"), frame(SP + "torch/autograd/__init__.py", 347, "backward"), frame(SP + "torch/_tensor.py", 581, "backward"), frame("/home/user/proj/train.py", 42, "main")]
OPT_STATE = [frame(SP + "torch/optim/adamw.py", 135, "_init_group"), frame(SP + "torch/optim/adamw.py", 209, "step"), frame(SP + "torch/optim/optimizer.py", 487, "wrapper"), frame("/home/user/proj/train.py", 43, "main")]
OPT_TEMP = [frame(SP + "torch/optim/adamw.py", 566, "_multi_tensor_adamw"), frame(SP + "torch/optim/adamw.py", 226, "step"), frame(SP + "torch/optim/optimizer.py", 487, "wrapper"), frame("/home/user/proj/train.py", 43, "main")]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-o", "--output", required=True)
    a = ap.parse_args()
    trace, live = [], {}
    state = {"addr": 0x7F0000000000, "t": 1_700_000_000_000_000}

    def entry(action, addr, size, frames, **extra):
        state["t"] += 10
        e = {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": state["t"], "frames": frames}
        e.update(extra)
        trace.append(e)

    def alloc(size, frames):
        addr = state["addr"]
        state["addr"] += size
        entry("segment_alloc", addr, size, frames)
        entry("alloc", addr, size, frames)
        live[addr] = (size, frames)
        return addr

    def free(addr):
        size, frames = live.pop(addr)
        entry("free_requested", addr, size, frames)
        entry("free_completed", addr, size, frames)

    for _ in range(4):
        alloc(64 * MIB, BUILD)
    acts = [alloc(96 * MIB, FORWARD) for _ in range(6)]
    for _ in range(4):
        alloc(64 * MIB, BACKWARD)  # gradients: outlive backward
    temps = [alloc(32 * MIB, BACKWARD) for _ in range(2)]
    for t in temps + acts:
        free(t)
    for _ in range(8):
        alloc(64 * MIB, OPT_STATE)
    opt_temps = [alloc(16 * MIB, OPT_TEMP) for _ in range(4)]
    for t in opt_temps:
        free(t)
    for _ in range(6):
        alloc(96 * MIB, FORWARD)
    # Freed blocks' segments were given back (empty_cache() in the loop): only live ones remain.
    entry("oom", 0, 1024 * MIB, FORWARD, device_free=180 * MIB)
    segments = [
        {
            "device": 0, "address": addr, "total_size": size, "stream": 0, "segment_type": "large",
            "segment_pool_id": (0, 0), "allocated_size": size, "active_size": size, "requested_size": size,
            "is_expandable": False, "frames": frames,
            "blocks": [{"address": addr, "size": size, "requested_size": size, "state": "active_allocated", "frames": frames}],
        }
        for addr, (size, frames) in sorted(live.items())
    ]
    snap = {"segments": segments, "device_traces": [trace], "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": -1, "expandable_segments": False}}
    with open(a.output, "wb") as f:
        pickle.dump(snap, f, protocol=4)


if __name__ == "__main__":
    main()
