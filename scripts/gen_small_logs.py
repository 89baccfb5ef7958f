#!/usr/bin/env python3
"""N small job logs for batch runs (the fleet test, the `diagnose --each` benchmark):
OUT/shard-SS/job-NNNNN.log, 100 a shard, a few KiB each, seeded. Each holds
training noise and, in most, one piece of evidence: a 2.4+ caching-allocator OOM
with random figures (fragmentation, capacity or one huge request), the text of a
fixture from fixtures/eval or fixtures/text (real reports and every message
shape the parsers know), or a small snapshot pickle from fixtures/snapshots;
some hold nothing to find.

usage: scripts/gen_small_logs.py OUT N [--seed S]
"""

import argparse
import os
import random
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MIB = 1 << 20
GIB = 1 << 30

OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {req}. GPU {gpu} has a total "
    "capacity of {cap} of which {free} is free. Including non-PyTorch memory, this process has "
    "{proc} memory in use. Of the allocated memory {alloc} is allocated by PyTorch, and {unalloc} "
    "is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting "
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for "
    "Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)\n"
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


def oom(rnd):
    cap = rnd.choice([24, 40, 48, 80, 94]) * GIB - rnd.randint(0, 900) * MIB
    shape = rnd.random()
    if shape < 0.5:  # fragmentation: much reserved but unallocated
        req = rnd.randint(256, 4096) * MIB
        unalloc = req + rnd.randint(1, 8) * GIB
    elif shape < 0.9:  # capacity: live tensors fill the card
        req = rnd.randint(20, 2048) * MIB
        unalloc = rnd.randint(1, 200) * MIB
    else:  # one request larger than the card
        req = cap + rnd.randint(1, 100) * GIB
        unalloc = rnd.randint(1, 200) * MIB
    free = rnd.randint(1, 300) * MIB
    proc = cap - free - rnd.randint(300, 900) * MIB
    alloc = max(proc - unalloc - rnd.randint(200, 600) * MIB, GIB)
    return OOM.format(
        req=size(req), gpu=rnd.randint(0, 7), cap=size(cap), free=size(free),
        proc=size(proc), alloc=size(alloc), unalloc=size(unalloc),
    )


def noise(rnd, step):
    return (
        f"Epoch {step // 1000} | step {step} | loss {rnd.uniform(0.5, 3):.4f} | "
        f"lr {rnd.uniform(1e-5, 1e-3):.2e} | tokens/s {rnd.randint(10000, 90000)}\n"
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("n", type=int)
    ap.add_argument("--seed", type=int, default=16)
    args = ap.parse_args()
    rnd = random.Random(args.seed)
    texts = sorted((REPO / "fixtures" / "eval").glob("*.txt")) + sorted((REPO / "fixtures" / "text").glob("*.log"))
    pickles = sorted((REPO / "fixtures" / "snapshots").glob("gen-small-*.pickle"))
    texts = [p.read_bytes() for p in texts]
    pickles = [p.read_bytes() for p in pickles]
    for i in range(args.n):
        shard = Path(args.out) / f"shard-{i // 100:02d}"
        shard.mkdir(parents=True, exist_ok=True)
        kind = rnd.random()
        if kind < 0.03:
            data = rnd.choice(pickles)
        else:
            step = rnd.randint(0, 100000)
            head = "".join(noise(rnd, step + k) for k in range(rnd.randint(5, 40))).encode()
            if kind < 0.65:
                body = oom(rnd).encode()
            elif kind < 0.9:
                body = rnd.choice(texts)
            else:
                body = b""
            data = head + body
        (shard / f"job-{i:05d}.log").write_bytes(data)
    print(f"{args.n} logs under {os.path.abspath(args.out)}")


if __name__ == "__main__":
    main()
