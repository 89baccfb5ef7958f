#!/usr/bin/env python3
"""Diagnose every log under a directory on a Dask cluster: one result per file,
written as JSON lines, the same lines as `allocdoc diagnose --each --format jsonl`.

    pip install allocdoc "dask[bag,distributed]"
    python fleet_dask.py /shared/oom-logs > results.jsonl                 # a local cluster
    python fleet_dask.py /shared/oom-logs --scheduler tcp://sched:8786   # a running cluster

Dask does the distribution: the files are a `dask.bag`, `allocdoc.diagnose`
runs on them where the workers are, and the results come back in input order.
On a real cluster the workers need `allocdoc` installed and the logs on a file
system they all see (or pass each file's bytes: `allocdoc.diagnose(data)`).
"""

import argparse
import json
import os
import sys
from pathlib import Path

import dask.bag as db
from distributed import Client, LocalCluster

import allocdoc


def log_files(root):
    """Every file under `root` in `allocdoc diagnose --each`'s order (docs/json.md):
    each directory's entries sorted by name, a subdirectory walked where it
    sorts, names starting with "." skipped, links to directories not followed."""
    found = []
    for entry in sorted(os.scandir(root), key=lambda e: e.name):
        if entry.name.startswith("."):
            continue
        if entry.is_dir(follow_symlinks=False):
            found.extend(log_files(entry.path))
        elif entry.is_file():
            found.append(entry.path)
    return found


def diagnose_one(path):
    """One file's line: its name, then `allocdoc diagnose --format json`'s fields,
    or the error that stopped it."""
    line = {"schema_version": allocdoc.SCHEMA_VERSION, "input": path}
    try:
        line.update(allocdoc.diagnose(Path(path)))
    except allocdoc.Error as e:
        line["error"] = {"kind": e.kind, "message": str(e)}
    return line


def diagnose_all(paths, client, partitions=None):
    """`diagnose_one` over `paths` on the cluster behind `client`, in order."""
    bag = db.from_sequence(paths, npartitions=partitions or max(1, len(paths) // 64))
    return bag.map(diagnose_one).compute(scheduler=client.get)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("root", help="a directory of logs (walked recursively)")
    ap.add_argument("--scheduler", help="a running Dask scheduler's address (default: a local cluster)")
    ap.add_argument("--workers", type=int, default=os.cpu_count(), help="local cluster: worker processes")
    args = ap.parse_args()
    if args.scheduler:
        client = Client(args.scheduler)
    else:
        cluster = LocalCluster(n_workers=args.workers, threads_per_worker=1, dashboard_address=":0")
        client = Client(cluster)
    with client:
        for line in diagnose_all(log_files(args.root), client):
            sys.stdout.write(json.dumps(line) + "\n")


if __name__ == "__main__":
    main()
