#!/usr/bin/env python3
"""Generated traced snapshots of a training loop with (or without) a leaking call site.

The `_snapshot()` dict layout: `segments` whose blocks are the end state of the trace,
`device_traces` with segment_alloc / alloc / free_requested / free_completed entries carrying
`time_us` and Python frames `{filename, line, name}` (innermost first, frame dicts and lists
shared as torch memoizes them), `allocator_settings`, and `external_annotations` with a
`ProfilerStep#N` START and END around each step (unless --no-annotations: then the steps are
found from the cycles of allocated memory).

The workload: 4 layers' parameters are made before the first step (`model.py:20:__init__` under
`torch/nn/modules/linear.py`); each step loads a batch, runs the forward pass (activations from
`model.py:41/42/43:forward`), the loss, the backward pass (temporaries and gradients), Adam's
step (its state made in step 0 and kept, temporaries), `zero_grad(set_to_none=True)` and then
`log_metrics` at `/home/user/proj/train.py:88`, which keeps --leak-bytes per step alive (a list
of loss tensors never cleared). --no-leak gives the control: the same workload, nothing kept.
Addresses come from a small model of the caching allocator (512-byte rounding, 2 MiB small /
20 MiB large segments, best fit, splits and merges), so addresses are reused across steps.

--eval-in-log: `log_metrics` also runs the model on an evaluation batch each step, under
`torch.nn.Module.__call__` (32 MiB of activations from `train.py:88`, freed before it returns): the
site then makes activations and keeps tensors of no category, and over the trace the activations
are most of its bytes, while at the peak (the training step's forward pass) it holds only what it
kept. The growth table and the peak table must give it the same category (issue 34, item 9).

Expected growth: the live bytes of `train.py:88:log_metrics` at the first alloc of steps
0..n-1 are 0, k, 2k, ... (n-1)k: k bytes per step over steps 0..n-1; nothing else grows (Adam's
state rises once, after step 0). Commands for the committed fixtures: fixtures/snapshots/README.md.

    scripts/gen_growth_snapshot.py -o fixtures/snapshots/gen-growth-leak.pickle
    scripts/gen_growth_snapshot.py --no-leak -o fixtures/snapshots/gen-growth-control.pickle
    scripts/gen_growth_snapshot.py --no-annotations -o fixtures/snapshots/gen-growth-leak-cycles.pickle
    scripts/gen_growth_snapshot.py --eval-in-log -o fixtures/snapshots/gen-growth-leak-eval.pickle
"""

import argparse
import pickle

KIB, MIB = 1 << 10, 1 << 20
SITE_PACKAGES = "/home/user/.venv/lib/python3.11/site-packages"
PROJ = "/home/user/proj"


class Allocator:
    """Just enough of CUDACachingAllocator for plausible addresses and an end-state segment list."""

    def __init__(self):
        self.segments = []  # {"address", "size", "pool", "frames", "blocks": [[addr, size, live, requested, frames]]}
        self.next_address = 0x7F4A00000000

    @staticmethod
    def round_size(size):
        # round_size (no roundup_power2_divisions): multiples of kMinBlockSize, 512 B
        return 512 if size < 512 else (size + 511) // 512 * 512

    @staticmethod
    def segment_size(rounded):
        # get_allocation_size: kSmallBuffer 2 MiB, kLargeBuffer 20 MiB below kMinLargeAlloc 10 MiB, else 2 MiB multiples
        if rounded <= MIB:
            return 2 * MIB
        if rounded < 10 * MIB:
            return 20 * MIB
        return (rounded + 2 * MIB - 1) // (2 * MIB) * (2 * MIB)

    def malloc(self, size, frames):
        """(block address, new segment (address, size) or None)."""
        rounded = self.round_size(size)
        pool = "small" if rounded <= MIB else "large"
        best = None
        for seg in self.segments:
            if seg["pool"] != pool:
                continue
            for k, b in enumerate(seg["blocks"]):
                if not b[2] and b[1] >= rounded and (best is None or (b[1], b[0]) < (best[2][1], best[2][0])):
                    best = (seg, k, b)
        new = None
        if best is None:
            total = self.segment_size(rounded)
            seg = {"address": self.next_address, "size": total, "pool": pool, "frames": frames,
                   "blocks": [[self.next_address, total, False, 0, []]]}
            self.next_address += (total + 2 * MIB - 1) // (2 * MIB) * (2 * MIB)
            self.segments.append(seg)
            best = (seg, 0, seg["blocks"][0])
            new = (seg["address"], total)
        seg, k, b = best
        rest = b[1] - rounded
        # should_split: small pool keeps a remainder >= 512 B, large one > 1 MiB
        if (pool == "small" and rest >= 512) or (pool == "large" and rest > MIB):
            seg["blocks"].insert(k + 1, [b[0] + rounded, rest, False, 0, []])
            b[1] = rounded
        b[2], b[3], b[4] = True, size, frames
        return b[0], new

    def free(self, address):
        for seg in self.segments:
            for k, b in enumerate(seg["blocks"]):
                if b[0] == address and b[2]:
                    b[2], b[3], b[4] = False, 0, []
                    blocks = seg["blocks"]
                    if k + 1 < len(blocks) and not blocks[k + 1][2]:  # merge with the next free block
                        b[1] += blocks.pop(k + 1)[1]
                    if k > 0 and not blocks[k - 1][2]:  # and the previous one
                        blocks[k - 1][1] += blocks.pop(k)[1]
                    return
        raise KeyError(hex(address))

    def end_state(self):
        out = []
        for seg in self.segments:
            blocks = [{"address": a, "size": s, "requested_size": r if live else 0,
                       "state": "active_allocated" if live else "inactive", "frames": f}
                      for a, s, live, r, f in seg["blocks"]]
            active = sum(b["size"] for b in blocks if b["state"] == "active_allocated")
            out.append({"device": 0, "address": seg["address"], "total_size": seg["size"], "stream": 0,
                        "segment_type": seg["pool"], "segment_pool_id": (0, 0), "is_expandable": False,
                        "allocated_size": active, "active_size": active,
                        "requested_size": sum(b["requested_size"] for b in blocks), "frames": seg["frames"],
                        "blocks": blocks})
        return out


class Recorder:
    """The trace, as `_record_memory_history(context="all"... python frames)` writes it."""

    def __init__(self):
        self.alloc = Allocator()
        self.trace = []
        self.time_us = 1_760_000_000_000_000
        self.sizes = {}

    def tick(self):
        self.time_us += 7
        return self.time_us

    def entry(self, action, addr, size, frames):
        self.trace.append({"action": action, "addr": addr, "size": size, "stream": 0,
                           "time_us": self.tick(), "frames": frames})

    def malloc(self, size, frames):
        addr, new = self.alloc.malloc(size, frames)
        if new:
            self.entry("segment_alloc", new[0], new[1], frames)
        self.entry("alloc", addr, size, frames)
        self.sizes[addr] = size
        return addr

    def free(self, addr, frames):
        size = self.sizes.pop(addr)
        self.entry("free_requested", addr, size, frames)
        self.alloc.free(addr)
        self.entry("free_completed", addr, size, frames)


def frame(path, line, name):
    return {"filename": path, "line": line, "name": name}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--leak-bytes", type=int, default=3 * MIB + 1234, help="k: bytes kept alive per step")
    ap.add_argument("--no-leak", action="store_true", help="the control: log_metrics keeps nothing")
    ap.add_argument("--no-annotations", action="store_true", help="no ProfilerStep#N annotations")
    ap.add_argument("--eval-in-log", action="store_true",
                    help="log_metrics also runs an evaluation forward pass (activations freed before it returns)")
    ap.add_argument("-o", "--output", required=True)
    a = ap.parse_args()

    torch = SITE_PACKAGES + "/torch"
    module = f"{torch}/nn/modules/module.py"
    main_ = [frame(f"{PROJ}/train.py", 100, "main"), frame(f"{PROJ}/train.py", 120, "<module>")]

    def step_line(line):
        return frame(f"{PROJ}/train.py", line, "train_step")

    call = [frame(module, 1750, "_call_impl"), frame(module, 1739, "_wrapped_call_impl")]
    params = [frame(f"{torch}/nn/modules/linear.py", 106, "__init__"), frame(f"{PROJ}/model.py", 20, "__init__"),
              frame(f"{PROJ}/train.py", 30, "main"), main_[1]]
    batch = [step_line(62)] + main_
    fwd = {line: [frame(f"{PROJ}/model.py", line, "forward")] + call + [step_line(64)] + main_
           for line in (41, 42, 43)}
    # gelu's output: the innermost frame is torch's, the site is the model line calling it
    fwd[42] = [frame(f"{torch}/nn/functional.py", 1700, "gelu")] + fwd[42]
    loss = [frame(f"{torch}/nn/functional.py", 3490, "cross_entropy"), step_line(65)] + main_
    backward = [frame(f"{torch}/autograd/graph.py", 825, "_engine_run_backward"),
                frame(f"{torch}/autograd/__init__.py", 347, "backward"),
                frame(f"{torch}/_tensor.py", 626, "backward"), step_line(66)] + main_
    adam = f"{torch}/optim/adam.py"
    optimizer = f"{torch}/optim/optimizer.py"
    adam_state = [frame(adam, 170, "_init_group"), frame(adam, 240, "step"),
                  frame(optimizer, 493, "wrapper"), step_line(68)] + main_
    adam_temp = [frame(adam, 431, "_single_tensor_adam"), frame(adam, 260, "step"),
                 frame(optimizer, 493, "wrapper"), step_line(68)] + main_
    zero_grad = [frame(optimizer, 975, "zero_grad"), step_line(69)] + main_
    leak = [frame(f"{PROJ}/train.py", 88, "log_metrics"), step_line(70)] + main_
    evaluation = [frame(f"{torch}/nn/functional.py", 2380, "linear")] + call + leak
    step_end = [step_line(71)] + main_

    r = Recorder()
    layers = 4
    weights = [r.malloc(8 * MIB, params) for _ in range(2 * layers)]
    biases = [r.malloc(4 * KIB, params) for _ in range(2 * layers)]
    parameters = weights + biases
    state = []
    annotations = []
    for step in range(a.steps):
        if not a.no_annotations:
            annotations.append({"stage": "START", "name": f"ProfilerStep#{step}", "device": 0, "time_us": r.tick()})
        x = r.malloc(2 * MIB, batch)
        acts = []
        for _ in range(layers):
            acts.append([r.malloc(64 * MIB, fwd[41]), r.malloc(64 * MIB, fwd[42]), r.malloc(32 * MIB, fwd[43])])
        out = r.malloc(4, loss)
        grads = []
        for layer in reversed(acts):
            temp = r.malloc(64 * MIB, backward)
            grads += [r.malloc(8 * MIB, backward), r.malloc(4 * KIB, backward)]
            for t in layer:
                r.free(t, backward)
            grads += [r.malloc(8 * MIB, backward), r.malloc(4 * KIB, backward)]
            r.free(temp, backward)
        r.free(x, step_end)
        if step == 0:
            state = [r.malloc(r.sizes[p], adam_state) for p in parameters for _ in range(2)]
        for p in parameters:
            t = r.malloc(r.sizes[p], adam_temp)
            r.free(t, adam_temp)
        for g in grads:
            r.free(g, zero_grad)
        if a.eval_in_log:
            r.free(r.malloc(32 * MIB, evaluation), evaluation)
        if not a.no_leak:
            r.malloc(a.leak_bytes, leak)  # kept: never freed
        r.free(out, step_end)
        if not a.no_annotations:
            annotations.append({"stage": "END", "name": f"ProfilerStep#{step}", "device": 0, "time_us": r.tick()})
    assert len(state) == 2 * len(parameters)

    snap = {
        "segments": r.alloc.end_state(),
        "device_traces": [r.trace],
        "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": -1,
                               "garbage_collection_threshold": 0.0, "expandable_segments": False,
                               "roundup_power2_divisions": {str(1 << k): 0 for k in range(16)}},
        "external_annotations": annotations,
    }
    with open(a.output, "wb") as f:
        pickle.dump(snap, f, protocol=4)


if __name__ == "__main__":
    main()
