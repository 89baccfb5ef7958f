#!/usr/bin/env python3
"""Write a traced `_snapshot()`-shaped pickle whose trace holds the same entry dicts twice (issue
41, item 5): pickle memoizes a repeated object, so the second time round the list refers back to
the first entries (BINGET) instead of writing them again. Torch never does this; a pickle may. The
attribution made while decoding takes each entry's values as the decoder builds it, so here it
must notice that what it took is not the trace and read the snapshot again the plain way.

One 2 MiB segment, a 1 KiB tensor allocated and freed, the pair twice.

    scripts/gen_shared_entries_snapshot.py -o fixtures/attribution/shared-trace-entries.pickle
"""

import argparse
import pickle


def snapshot():
    frames = [{"filename": "/home/user/train.py", "line": 3, "name": "main"}]
    alloc = {"action": "alloc", "addr": 4096, "size": 1024, "stream": 0, "time_us": 10,
             "frames": frames}
    free = {"action": "free_completed", "addr": 4096, "size": 1024, "stream": 0, "time_us": 11,
            "frames": frames}
    block = {"address": 0, "size": 2 << 20, "requested_size": 0, "state": "inactive",
             "frames": []}
    segment = {"device": 0, "address": 0, "total_size": 2 << 20, "stream": 0,
               "segment_type": "small", "allocated_size": 0, "active_size": 0,
               "requested_size": 0, "blocks": [block]}
    return {"segments": [segment], "device_traces": [[alloc, free, alloc, free]],
            "allocator_settings": {}}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-o", "--output", required=True)
    args = ap.parse_args()
    with open(args.output, "wb") as f:
        pickle.dump(snapshot(), f, protocol=4)


if __name__ == "__main__":
    main()
