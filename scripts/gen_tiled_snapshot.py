#!/usr/bin/env python3
"""A large traced snapshot made by tiling a real trace: the input of the `top` speed benchmark.

Repeats one device's trace of a real snapshot (default: wedsonlin's device 0) until it holds about
--entries entries, each tile's `time_us` shifted past the previous tile's end. Every tile must
leave the live set as it found it, so that allocs and frees stay balanced on the same addresses
and the snapshot's segments (copied unchanged, with `allocator_settings` and
`external_annotations`) still describe the end state. Entries that would break this are dropped
from the tile, with a count on stderr: an `alloc` the tile never frees (and its
`free_requested`), and a free of memory the tile did not allocate (its `free_requested` and
`free_completed`, memory live before the trace). wedsonlin's trace needs no drop.

Frames are shared as torch memoizes them: every tile's entries refer to the very same frame
lists and frame dicts as the original, so pickle's memo writes each once.

    scripts/gen_tiled_snapshot.py --entries 1000000 -o target/tiled-1m.pickle

The peak of allocated memory recurs in every tile, so the first tile's peak (event index and
bytes) is the whole file's peak (check: scripts/attribution_oracle.py on the output).
"""

import argparse
import os
import pickle
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT = os.path.join(HERE, "..", "fixtures", "snapshots",
                       "wedsonlin-assignment2-systems_medium_128_inference_memory_snapshot.pickle")


class DataOnly(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"refused global {module}.{name}")


def balanced_tile(trace):
    """The entries of `trace` that return the traced live set to where it started, and the drops."""
    live = {}  # addr -> index of the live alloc
    keep = [True] * len(trace)
    requested = {}  # addr -> index of the last free_requested not yet completed
    unpaired_frees = 0
    for i, e in enumerate(trace):
        action, addr = e.get("action"), e.get("addr")
        if action == "alloc":
            if addr in live:  # the earlier one was never freed in the tile
                keep[live[addr]] = False
                if addr in requested:
                    keep[requested.pop(addr)] = False
            live[addr] = i
        elif action == "free_requested":
            requested[addr] = i
        elif action == "free_completed":
            if addr in live:
                del live[addr]
                requested.pop(addr, None)
            else:
                keep[i] = False
                if addr in requested:
                    keep[requested.pop(addr)] = False
                unpaired_frees += 1
    never_freed = list(live.values())
    for i in never_freed:
        keep[i] = False
    # A free_requested of an alloc that is dropped goes with it (none completes after it).
    for addr, i in requested.items():
        keep[i] = False
    dropped_allocs = sum(1 for i, e in enumerate(trace) if e.get("action") == "alloc" and not keep[i])
    return [e for e, k in zip(trace, keep) if k], dropped_allocs, unpaired_frees


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--entries", type=int, default=1_000_000, help="about this many trace entries")
    ap.add_argument("--source", default=DEFAULT, help="the snapshot whose trace is tiled")
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--protocol", type=int, default=4, help="pickle protocol (torch's default is 4)")
    ap.add_argument("-o", "--output", required=True)
    a = ap.parse_args()

    with open(a.source, "rb") as f:
        snap = DataOnly(f).load()
    tile, dropped_allocs, unpaired_frees = balanced_tile(snap["device_traces"][a.device])
    if not tile:
        sys.exit("the trace has no balanced entries to tile")
    times = [e["time_us"] for e in tile if "time_us" in e]
    span = (max(times) - min(times)) if times else 0
    # The next tile starts one median gap after this one ends.
    gaps = sorted(b - a for a, b in zip(times, times[1:])) or [1]
    period = span + max(gaps[len(gaps) // 2], 1)
    tiles = max(1, round(a.entries / len(tile)))

    trace = []
    for k in range(tiles):
        shift = k * period
        for e in tile:
            c = dict(e)  # the same frames list object (and frame dicts) as the original entry
            if "time_us" in c:
                c["time_us"] = e["time_us"] + shift
            trace.append(c)
    out = dict(snap)
    traces = list(snap["device_traces"])
    traces[a.device] = trace
    out["device_traces"] = traces
    with open(a.output, "wb") as f:
        pickle.dump(out, f, protocol=a.protocol)
    print(f"{a.output}: {tiles} tiles of {len(tile)} entries = {len(trace)} entries "
          f"(dropped per tile: {dropped_allocs} allocs never freed, {unpaired_frees} frees of memory "
          f"allocated before the tile; period {period} us), {os.path.getsize(a.output)} bytes",
          file=sys.stderr)


if __name__ == "__main__":
    main()
