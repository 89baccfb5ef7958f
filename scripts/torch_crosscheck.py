#!/usr/bin/env python3
"""Replay an allocdoc trace CSV through real PyTorch and write its memory_stats() as JSON.

The output is what `allocdoc replay TRACE --conf C --capacity SIZE --compare-with OUT.json`
compares the bundled allocator with: the same trace, the same PYTORCH_CUDA_ALLOC_CONF, the same
capacity (through torch.cuda.set_per_process_memory_fraction).

    python3 scripts/torch_crosscheck.py trace.csv --conf expandable_segments:True \
        --capacity 8GiB --out stats.json

Every `alloc` is torch.empty(size, dtype=torch.uint8) on the trace's stream, every `free` drops
the tensor, `empty_cache` calls torch.cuda.empty_cache(). The replay stops at the first
OutOfMemoryError, as allocdoc's does, and records which event failed.

Notes on fidelity:
* the config must be in the environment before torch is imported: this script sets
  PYTORCH_CUDA_ALLOC_CONF (and PYTORCH_ALLOC_CONF) itself and imports torch afterwards;
* set_per_process_memory_fraction also arms garbage_collection_threshold (PyTorch only runs
  the GC with a fraction set), so a capacity here means a fraction in PyTorch;
* a tensor of 0 bytes never reaches the allocator; the trace's sizes are used as they are.
"""

import argparse
import json
import os
import re
import sys
import time

UNITS = {"": 1, "b": 1, "k": 1024, "kb": 1024, "kib": 1024, "m": 1024**2, "mb": 1024**2,
         "mib": 1024**2, "g": 1024**3, "gb": 1024**3, "gib": 1024**3, "t": 1024**4,
         "tb": 1024**4, "tib": 1024**4}


def parse_size(text):
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).lower() not in UNITS:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 24GiB, 80000000000)")
    return round(float(m.group(1)) * UNITS[m.group(2).lower()])


def read_trace(path):
    """Yields (line_number, action, id, size, stream) for every event, as allocdoc counts them."""
    with open(path, newline="") as f:
        header_seen = False
        for lineno, raw in enumerate(f, start=1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            fields = [x.strip() for x in line.split(",")]
            if not header_seen:
                header_seen = True
                if fields[0] == "action":
                    continue
            fields += [""] * (4 - len(fields))
            action, ident, size, stream = fields[:4]
            if action not in ("alloc", "free", "empty_cache"):
                sys.exit(f"{path}:{lineno}: expected alloc, free or empty_cache, found {action!r}")
            if action == "alloc" and not size.isdigit():
                sys.exit(f"{path}:{lineno}: alloc needs a size in bytes, found {size!r}")
            yield lineno, action, ident, int(size) if size else 0, int(stream) if stream else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace", help="trace CSV (action,id,size,stream)")
    ap.add_argument("--conf", default="", help="PYTORCH_CUDA_ALLOC_CONF value ('' = defaults)")
    ap.add_argument("--capacity", type=parse_size, help="cap via set_per_process_memory_fraction")
    ap.add_argument("--device", type=int, default=0, help="CUDA device index")
    ap.add_argument("--out", required=True, help="where to write the JSON")
    args = ap.parse_args()

    # Before the import: PyTorch reads the config once, when the allocator starts.
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = args.conf
    os.environ["PYTORCH_ALLOC_CONF"] = args.conf
    import torch  # noqa: E402

    if not torch.cuda.is_available():
        sys.exit("torch_crosscheck: torch sees no CUDA device")
    dev = torch.device("cuda", args.device)
    torch.cuda.set_device(dev)
    total = torch.cuda.get_device_properties(dev).total_memory
    if args.capacity:
        if args.capacity > total:
            sys.exit(f"torch_crosscheck: --capacity {args.capacity} exceeds the card's {total} bytes")
        torch.cuda.set_per_process_memory_fraction(args.capacity / total, dev)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(dev)

    streams = {0: torch.cuda.current_stream(dev)}
    live = {}
    oom = None
    events = 0
    start = time.perf_counter()
    for index, (lineno, action, ident, size, stream) in enumerate(read_trace(args.trace)):
        events = index + 1
        if action == "alloc":
            if stream not in streams:
                streams[stream] = torch.cuda.Stream(dev)
            try:
                with torch.cuda.stream(streams[stream]):
                    live[ident] = torch.empty(size, dtype=torch.uint8, device=dev)
            except torch.cuda.OutOfMemoryError as e:
                oom = {"event_index": index, "line": lineno, "requested_bytes": size,
                       "message": str(e).splitlines()[0] if str(e) else ""}
                break
        elif action == "free":
            live.pop(ident, None)
        else:
            torch.cuda.empty_cache()
    torch.cuda.synchronize(dev)
    elapsed = time.perf_counter() - start

    stats = {k: int(v) if isinstance(v, (int, bool)) else v
             for k, v in torch.cuda.memory_stats(dev).items()}
    segments = [s for s in torch.cuda.memory_snapshot() if s.get("device") == args.device]
    result = {
        "source": "torch_crosscheck.py",
        "torch_version": torch.__version__,
        "device_name": torch.cuda.get_device_name(dev),
        "device_total_bytes": total,
        "conf": args.conf,
        "capacity_bytes": args.capacity,
        "trace": os.path.abspath(args.trace),
        "events": events,
        "oom": oom,
        "peak_reserved_bytes": stats.get("reserved_bytes.all.peak", 0),
        "peak_allocated_bytes": stats.get("allocated_bytes.all.peak", 0),
        "device_allocs": stats.get("num_device_alloc", 0),
        "device_frees": stats.get("num_device_free", 0),
        "alloc_retries": stats.get("num_alloc_retries", 0),
        "num_ooms": stats.get("num_ooms", 0),
        "segments_at_end": len(segments),
        "replay_seconds": round(elapsed, 4),
        "memory_stats": stats,
    }
    live.clear()
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1, sort_keys=True)
    print(f"{args.trace} [{args.conf or 'default'}]: peak reserved {result['peak_reserved_bytes']}, "
          f"retries {result['alloc_retries']}, oom {'at event %d' % oom['event_index'] if oom else 'none'}",
          file=sys.stderr)
    return 1 if oom else 0


if __name__ == "__main__":
    sys.exit(main())
