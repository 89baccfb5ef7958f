#!/usr/bin/env python3
"""Replays an allocdoc trace CSV through DynaPipe's Python model of PyTorch's
caching allocator, the speed anchor of BENCHMARKS.md ("Whole-process replay").

The model is not part of this repository: fetch
awslabs/optimizing-multitask-training-through-dynamic-pipelines and pass the
path of its dynapipe/memory_opt/allocation_simulator.py (it needs the
sortedcontainers package).

usage: dynapipe_replay.py ALLOCATION_SIMULATOR_PY TRACE_CSV [CAPACITY_BYTES]
"""
import csv
import importlib.util
import sys


def load_model(path):
    spec = importlib.util.spec_from_file_location("allocation_simulator", path)
    module = importlib.util.module_from_spec(spec)
    # dataclasses looks its module up while the module loads.
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def main():
    model_path, trace_path = sys.argv[1], sys.argv[2]
    capacity = int(sys.argv[3]) if len(sys.argv) > 3 else 80 << 30
    model = load_model(model_path)
    # The model counts memory in units of 1e6 bytes.
    sim = model.TorchCachingAllocatorSimulator(capacity / 1e6)
    live = {}
    events = 0
    with open(trace_path, newline="", encoding="utf-8-sig") as f:
        rows = csv.reader(f)
        for row in rows:
            if not row or row[0].lstrip().startswith("#"):
                continue
            if row[0] == "action":
                continue
            action, key = row[0], row[1]
            stream = int(row[3]) if len(row) > 3 and row[3] else 0
            events += 1
            if action == "alloc":
                live[key] = sim.malloc(int(row[2]), stream)
            elif action == "free":
                sim.free(live.pop(key))
            elif action == "empty_cache":
                sim.clear_cache()
    print(
        f"{events} events, peak reserved {sim.peak_backend_allocated_bytes} bytes, "
        f"peak allocated {sim.peak_allocated_bytes} bytes, "
        f"{sim.n_backend_mallocs} device allocs"
    )


if __name__ == "__main__":
    main()
