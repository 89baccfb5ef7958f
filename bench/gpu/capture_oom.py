"""The GPU check of allocdoc.capture (bench/gpu/run.sh runs it; needs torch with CUDA).

1. Cost: the time of N small cudaCaching allocations+frees with PyTorch's
   recording off, then on as allocdoc.capture starts it (Python stacks), on the
   same card, interleaved rounds; written to OUT/capture-cost.json.
2. A small workload that runs out of memory whatever the card's size: 1 GiB
   blocks with every other one freed (holes of 1 GiB), then 2.5 GiB requests
   until the allocator raises. allocdoc.capture writes the incident directory;
   its path goes to OUT/capture-incident.txt for run.sh to replay.

Usage: PYTHONPATH=python python3 bench/gpu/capture_oom.py OUT
"""

import json
import os
import sys
import time

import torch

import allocdoc

MIB = 1 << 20
GIB = 1 << 30


def alloc_free_seconds(n):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        x = torch.empty(4096, dtype=torch.uint8, device="cuda")
        del x
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def cost(out, n=20_000, rounds=5):
    """Seconds per alloc+free pair, recording off vs on, interleaved."""
    alloc_free_seconds(1000)  # warm the cache and the CUDA context
    off, on = [], []
    for _ in range(rounds):
        off.append(alloc_free_seconds(n))
        with allocdoc.capture(directory=os.path.join(out, "cost-capture"), max_entries=n):
            on.append(alloc_free_seconds(n))
    result = {
        "pairs_per_round": n,
        "rounds": rounds,
        "off_us_per_pair_min": min(off) / n * 1e6,
        "on_us_per_pair_min": min(on) / n * 1e6,
        "off_s": off,
        "on_s": on,
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(0),
    }
    with open(os.path.join(out, "capture-cost.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(
        f"alloc+free of 4 KiB: {result['off_us_per_pair_min']:.2f} us without recording, "
        f"{result['on_us_per_pair_min']:.2f} us with allocdoc.capture (min of {rounds} rounds of {n})"
    )


def run_out_of_memory(out):
    """Raises torch.cuda.OutOfMemoryError (the second one) out of the capture."""
    keep = []
    with allocdoc.capture(directory=os.path.join(out, "capture")):
        try:
            while True:
                keep.append(torch.empty(GIB, dtype=torch.uint8, device="cuda"))
        except torch.cuda.OutOfMemoryError:
            pass
        # That first OOM filled the card; free every other block, then ask for
        # more than any hole holds.
        print(f"filled the card with {len(keep)} x 1 GiB", flush=True)
        del keep[::2]
        try:
            while True:
                keep.append(torch.empty(5 * GIB // 2, dtype=torch.uint8, device="cuda"))
        except torch.cuda.OutOfMemoryError as e:
            print(f"second OOM after {len(keep)} blocks: {str(e).splitlines()[0]}", flush=True)
            raise


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    cost(out)
    try:
        run_out_of_memory(out)
    except torch.cuda.OutOfMemoryError:
        pass
    else:
        print("the workload did not run out of memory")
        return 1
    incidents = sorted(os.listdir(os.path.join(out, "capture")))
    print("incidents:", incidents)
    with open(os.path.join(out, "capture-incident.txt"), "w") as f:
        f.write(os.path.join(out, "capture", incidents[-1]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
