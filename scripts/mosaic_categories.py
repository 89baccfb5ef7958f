#!/usr/bin/env python3
"""Mosaic's figures for a snapshot, as JSON: a measurement aid for comparing allocdoc with Mosaic.

Runs only in a virtual environment where Mosaic (facebookresearch/mosaic) is installed; it calls
Mosaic's own analysis and contains none of its code:

    python3 -m venv /tmp/mosaic-venv
    /tmp/mosaic-venv/bin/pip install PATH/TO/mosaic   # see /work/notes/mosaic-results.md
    /tmp/mosaic-venv/bin/python scripts/mosaic_categories.py SNAPSHOT [--no-peak]

Prints what `mosaic_get_memory_profile --profile categories` prints as "Memory Usage At Peak"
(its per-category bytes when the trace's allocated bytes peaked, as exact numbers instead of
rounded GiB/MB text), and what `mosaic_get_memory_usage_peak` logs (dynamic peak relative to the
trace start, static memory estimate). A Mosaic exception is reported as `error` for that part,
and the exit code is 1 when either part failed.
"""

import argparse
import json
import logging
import sys
import traceback

from mosaic.libmosaic.analyzer.memory_abstract import MemoryAbstract


def error(e):
    last = traceback.extract_tb(e.__traceback__)[-1]
    return {"exception": f"{type(e).__name__}: {e}", "at": f"{last.filename}:{last.lineno}"}


def categories(path):
    m = MemoryAbstract(memory_snapshot_file=path)
    m.load_memory_snapshot()
    m.memory_snapshot.analyze_memory_snapshot("alloc_history", profile_types=["categories"])
    peak = m.memory_snapshot.max_memory_usage
    return {
        "total_allocated_bytes": peak.total_alloc,
        "categories": {c.name: b for c, b in sorted(peak.per_category_alloc_sum.items(),
                                                    key=lambda kv: (-kv[1], kv[0].name))},
    }


def peak(path):
    m = MemoryAbstract(memory_snapshot_file=path)
    m.load_memory_snapshot()
    m.memory_snapshot.analyze_memory_snapshot(opt="memory_peak", allocation="", action="alloc")
    s = m.memory_snapshot
    return {"dynamic_peak_bytes": s.dynamic_memory_peak, "static_bytes": s.static_memory}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("snapshot")
    ap.add_argument("--no-peak", action="store_true", help="only the categories")
    a = ap.parse_args()
    logging.getLogger().setLevel(logging.ERROR)
    out, failed = {"snapshot": a.snapshot}, False
    parts = [("at_peak", categories)] + ([] if a.no_peak else [("peak", peak)])
    for name, fn in parts:
        try:
            out[name] = fn(a.snapshot)
        except Exception as e:  # Mosaic's own failure is the measurement here
            out[name] = {"error": error(e)}
            failed = True
    json.dump(out, sys.stdout, indent=1)
    print()
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
