#!/usr/bin/env python3
"""Generate a torch-shaped CUDA memory snapshot pickle (the dict `_snapshot()` returns).

Segments are tiled exactly by blocks (allocated_size / active_size / requested_size are the
sums §9.2 of the allocator spec defines), frames are `{filename, line, name}` dicts drawn from
a pool and tracebacks are shared lists, as torch's `py_symbolize` dedupes them, so the pickle
is full of memo back-references. A trace ring buffer of alloc / free_requested / free_completed
/ segment_alloc entries follows. Deterministic for a given --seed.

Small outputs are committed under fixtures/snapshots/ for tests; benches generate large ones
at run time, e.g. about 200 MB:

    scripts/gen_snapshot.py --blocks 1700000 --trace 1700000 -o target/snap-200mb.pickle
"""

import argparse
import pickle
import random

MIB = 1 << 20


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--blocks", type=int, default=200, help="blocks in all segments")
    ap.add_argument("--trace", type=int, default=200, help="trace entries on device 0")
    ap.add_argument("--unique-frames", type=int, default=5000)
    ap.add_argument("--tracebacks", type=int, default=2000, help="distinct shared frame lists")
    ap.add_argument("--plain", action="store_true", help="fresh frame objects everywhere (no sharing)")
    ap.add_argument("--devices", type=int, default=1, help="devices holding segments")
    ap.add_argument("--protocol", type=int, default=4, choices=range(0, 6))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--recorded-conf", default="",
                    help="PYTORCH_CUDA_ALLOC_CONF as recorded (the effective settings stay the defaults, "
                         "as when a value was silently ignored)")
    ap.add_argument("-o", "--output", required=True)
    a = ap.parse_args()
    rnd = random.Random(a.seed)

    files = [f"/home/user/project/model/layer{i}.py" for i in range(40)]
    names = ["forward", "backward", "_conv_forward", "linear", "matmul", "empty_strided_cuda",
             "allocate", "train_step", "<module>", "_call_impl"]
    frame_pool = [{"filename": rnd.choice(files), "line": rnd.randint(1, 2000), "name": rnd.choice(names)}
                  for _ in range(a.unique_frames)]
    tb_pool = [[rnd.choice(frame_pool) for _ in range(rnd.randint(6, 18))] for _ in range(max(1, a.tracebacks))]

    def frames():
        tb = rnd.choice(tb_pool)
        if a.plain:
            return [dict(f) for f in tb]
        return tb

    segments = []
    address = 0x7F0000000000
    left = a.blocks
    seg_i = 0
    while left > 0:
        n = min(left, rnd.randint(1, 12))
        left -= n
        small = n == 1 and rnd.random() < 0.3
        blocks = []
        baddr = address
        for _ in range(n):
            size = rnd.choice([512, 1024, 4096, 65536]) if small else rnd.randint(1, 64) * 2 * MIB // 4 * 4
            size = max(512, (size + 511) // 512 * 512)
            state = rnd.choices(["active_allocated", "inactive", "active_pending_free"], [6, 3, 1])[0]
            req = size - rnd.randint(0, min(511, size - 1)) if state != "inactive" else 0
            blocks.append({"address": baddr, "size": size, "requested_size": req, "state": state,
                           "frames": frames() if state != "inactive" else []})
            baddr += size
        total = baddr - address
        segments.append({
            "device": seg_i % a.devices,
            "address": address,
            "total_size": total,
            "allocated_size": sum(b["size"] for b in blocks if b["state"] == "active_allocated"),
            "active_size": sum(b["size"] for b in blocks if b["state"] != "inactive"),
            "requested_size": sum(b["requested_size"] for b in blocks if b["state"] != "inactive"),
            "stream": 0,
            "segment_type": "small" if small else "large",
            "segment_pool_id": (0, 0),
            "is_expandable": False,
            "frames": [],
            "blocks": blocks,
        })
        address += total + 2 * MIB
        seg_i += 1
    segments.sort(key=lambda s: (s["device"], s["address"]))

    trace = []
    live = []
    t = 1_700_000_000_000_000
    while len(trace) < a.trace:
        t += rnd.randint(1, 500)
        if live and rnd.random() < 0.45:
            addr, size, fr = live.pop(rnd.randrange(len(live)))
            trace.append({"action": "free_requested", "addr": addr, "size": size, "stream": 0,
                          "time_us": t, "frames": fr})
            trace.append({"action": "free_completed", "addr": addr, "size": size, "stream": 0,
                          "time_us": t, "frames": fr})
        else:
            if rnd.random() < 0.01:
                trace.append({"action": "segment_alloc", "addr": address, "size": 20 * MIB, "stream": 0,
                              "time_us": t, "frames": frames()})
                address += 20 * MIB
            size = rnd.randint(1, 8 * MIB)
            fr = frames()
            addr = 0x7E0000000000 + rnd.randrange(1 << 30) * 512
            trace.append({"action": "alloc", "addr": addr, "size": size, "stream": 0, "time_us": t, "frames": fr})
            live.append((addr, size, fr))
    del trace[a.trace:]

    device_traces = [trace] + [[] for _ in range(a.devices - 1)]
    snapshot = {
        "segments": segments,
        "device_traces": device_traces,
        "allocator_settings": {
            "PYTORCH_CUDA_ALLOC_CONF": a.recorded_conf, "max_split_size": -1, "garbage_collection_threshold": 0.0,
            "expandable_segments": False, "pinned_num_register_threads": 1,
            "release_lock_on_cudamalloc": False, "pinned_use_cuda_host_register": False,
            "roundup_power2_divisions": {str(1 << i): 0 for i in range(16)},
        },
        "external_annotations": [],
    }
    with open(a.output, "wb") as f:
        pickle.dump(snapshot, f, protocol=a.protocol)


if __name__ == "__main__":
    main()
