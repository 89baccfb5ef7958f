#!/usr/bin/env python3
"""Write a small `_snapshot()`-shaped pickle of a 3-GPU process recorded with
`expandable_segments:True` whose second device (cuda:1) runs out of memory, the shape of a
real snapshot whose trace of cuda:1 holds an `oom` entry (a 5.3 GB request, 95 MB free,
78.42 GiB reserved) while cuda:0 and cuda:2 end normally.

Each device maps one expandable large-pool segment page by page (`segment_map` entries)
and fills it with parameters and activations (Python stacks on every entry). Figures:

    cuda:0 and cuda:2: 40 GiB parameters + 30 GiB activations live, 70.25 GiB mapped, no OOM.
    cuda:1: 40 GiB parameters + 38 GiB activations + 320 MiB live (78.3125 GiB), 78.42 GiB
    mapped (110 MiB mapped but free), then an `oom` entry: a request of 2529 pages of 2 MiB
    (5 303 697 408 B, 4.94 GiB) with device_free 95 MiB.

    scripts/gen_multidevice_oom_snapshot.py -o fixtures/snapshots/gen-multidevice-oom-dev1.pickle

With --unwound, the shape of a snapshot dumped after the OOM was caught (issue 34): cuda:1
holds 6 x 7 GiB parameters + 2 x 17.5 GiB activations + 400 MiB logits (77.39 GiB) in
77.50 GiB mapped, then an `oom` entry for 3000 pages (5.86 GiB) with 80 MiB free; the
exception unwinds and every block but the logits is freed, so at the dump 400 MiB of the
77.50 GiB reserved is allocated (0.5 %) and the rest sits free in the one segment that still
holds a live block. The OOM is the event; the state after it is not its cause.

    scripts/gen_multidevice_oom_snapshot.py --unwound -o fixtures/snapshots/gen-multidevice-oom-unwound.pickle
"""

import argparse
import pickle

MIB = 1 << 20
GIB = 1 << 30
PAGE = 2 * MIB
SP = "/home/user/venv/lib/python3.11/site-packages/"


def frame(filename, line, name):
    return {"filename": filename, "line": line, "name": name}


TRAIN = frame("/home/user/proj/train.py", 60, "main")
BUILD = [frame(SP + "torch/nn/modules/module.py", 1340, "_apply"), frame(SP + "torch/nn/modules/module.py", 1355, "to"), frame("/home/user/proj/train.py", 31, "main")]
FORWARD = [frame("/home/user/proj/model.py", 88, "forward"), frame(SP + "torch/nn/modules/module.py", 1747, "_call_impl"), frame(SP + "torch/nn/modules/module.py", 1736, "_wrapped_call_impl"), TRAIN]
LOGITS = [frame("/home/user/proj/model.py", 112, "forward"), frame(SP + "torch/nn/modules/module.py", 1747, "_call_impl"), frame(SP + "torch/nn/modules/module.py", 1736, "_wrapped_call_impl"), TRAIN]


def device(index, base, live, mapped, oom=None, keep=None):
    """One device's trace and its expandable segment: `live` is a list of
    (size, frames), allocated in order from `base`; `mapped` bytes are mapped.
    `keep`: after the OOM, every block but those indices is freed (the exception unwound)."""
    trace = []
    t = [1_700_000_000_000_000 + index * 1_000_000]

    def entry(action, addr, size, frames, **extra):
        t[0] += 10
        e = {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": t[0], "frames": frames}
        e.update(extra)
        trace.append(e)

    top, blocks = base, []
    for size, frames in live:
        entry("segment_map", top, size, frames)
        entry("alloc", top, size, frames)
        blocks.append({"address": top, "size": size, "requested_size": size, "state": "active_allocated", "frames": frames})
        top += size
    if mapped > top - base:
        # Pages mapped for a request that was freed again: cached, free.
        tail = mapped - (top - base)
        entry("segment_map", top, tail, FORWARD)
        entry("alloc", top, tail, FORWARD)
        entry("free_requested", top, tail, FORWARD)
        entry("free_completed", top, tail, FORWARD)
        blocks.append({"address": top, "size": tail, "requested_size": 0, "state": "inactive", "frames": []})
    if oom is not None:
        size, free = oom
        entry("oom", 0, size, LOGITS, device_free=free)
    if keep is not None:
        for i, b in enumerate(blocks[:len(live)]):
            if i not in keep:
                entry("free_requested", b["address"], b["size"], b["frames"])
                entry("free_completed", b["address"], b["size"], b["frames"])
                b.update(state="inactive", requested_size=0, frames=[])
        live = [x for i, x in enumerate(live) if i in keep]
        # Free neighbours coalesce, as the allocator merges them.
        merged = []
        for b in blocks:
            if merged and b["state"] == merged[-1]["state"] == "inactive":
                merged[-1]["size"] += b["size"]
            else:
                merged.append(b)
        blocks = merged
    allocated = sum(s for s, _ in live)
    segment = {
        "device": index, "address": base, "total_size": mapped, "stream": 0, "segment_type": "large",
        "segment_pool_id": (0, 0), "allocated_size": allocated, "active_size": allocated,
        "requested_size": allocated, "is_expandable": True, "frames": [], "blocks": blocks,
    }
    return trace, segment


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--unwound", action="store_true", help="cuda:1 frees all but its logits after the OOM")
    ap.add_argument("-o", "--output", required=True)
    a = ap.parse_args()
    if a.unwound:
        params = [(7 * GIB, BUILD)] * 6
        ok = params + [(5 * GIB, FORWARD)] * 5
        full = params + [(17 * GIB + 512 * MIB, FORWARD)] * 2 + [(400 * MIB, LOGITS)]
        devices = [
            (ok, 67 * GIB + 128 * MIB, None, None),
            (full, 77 * GIB + 512 * MIB, (3000 * PAGE, 80 * MIB), {len(full) - 1}),
            (ok, 67 * GIB + 128 * MIB, None, None),
        ]
    else:
        params = [(8 * GIB, BUILD)] * 5
        ok = params + [(6 * GIB, FORWARD)] * 5
        full = params + [(19 * GIB, FORWARD)] * 2 + [(320 * MIB, LOGITS)]
        devices = [
            (ok, 70 * GIB + 256 * MIB, None, None),
            (full, 78 * GIB + 430 * MIB, (2529 * PAGE, 95 * MIB), None),
            (ok, 70 * GIB + 256 * MIB, None, None),
        ]
    traces, segments = [], []
    for index, (live, mapped, oom, keep) in enumerate(devices):
        trace, segment = device(index, 0x7F0000000000 + index * (1 << 40), live, mapped, oom, keep)
        traces.append(trace)
        segments.append(segment)
    snap = {
        "segments": segments,
        "device_traces": traces,
        "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "max_split_size": -1, "expandable_segments": True},
    }
    with open(a.output, "wb") as f:
        pickle.dump(snap, f, protocol=4)


if __name__ == "__main__":
    main()
