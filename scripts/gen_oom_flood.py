#!/usr/bin/env python3
"""An aggregated log of a large job's OOMs (issue 27 item 4, BENCHMARKS.md):
N one-line PyTorch 2.4+ caching-allocator OOM messages, message i on rank
i % RANKS and GPU i % 8, each with random request and free figures (seeded),
a training-noise line between messages. Every message is a separate incident.

usage: scripts/gen_oom_flood.py OUT N [--ranks R] [--seed S]
"""

import argparse
import random

MIB = 1 << 20
GIB = 1 << 30
CAPACITY = 79.25 * GIB

OOM = (
    "[rank{rank}]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {req}. GPU {gpu} "
    "has a total capacity of 79.25 GiB of which {free} is free. Including non-PyTorch memory, this "
    "process has {proc} memory in use. Of the allocated memory {alloc} is allocated by PyTorch, and "
    "{unalloc} is reserved by PyTorch but unallocated. If reserved but unallocated memory is large "
    "try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See "
    "documentation for Memory Management  "
    "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)\n"
)


def size(n):
    """PyTorch's format_size: B, KiB, MiB or GiB with two decimals."""
    if n < 1024:
        return f"{n} bytes"
    if n < MIB:
        return f"{n / 1024:.2f} KiB"
    if n < GIB:
        return f"{n / MIB:.2f} MiB"
    return f"{n / GIB:.2f} GiB"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("n", type=int)
    ap.add_argument("--ranks", type=int, default=512)
    ap.add_argument("--seed", type=int, default=27)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    with open(a.out, "w") as f:
        for i in range(a.n):
            free = rng.randrange(1 * MIB, 4 * GIB)
            req = rng.randrange(2 * MIB, 16 * GIB)
            unalloc = rng.randrange(0, 2 * GIB)
            proc = int(CAPACITY) - free
            alloc = max(proc - unalloc - 512 * MIB, 0)
            f.write(f"step {i // a.ranks} loss 2.{rng.randrange(1000):03d}\n")
            f.write(
                OOM.format(
                    rank=i % a.ranks,
                    gpu=i % 8,
                    req=size(req),
                    free=size(free),
                    proc=size(proc),
                    alloc=size(alloc),
                    unalloc=size(unalloc),
                )
            )


if __name__ == "__main__":
    main()
