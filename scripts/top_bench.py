#!/usr/bin/env python3
"""Side by side: `allocdoc top` against Mosaic's peak and categories commands on one snapshot.

Runs N rounds (default 5), interleaved: in each round `allocdoc top SNAPSHOT --at peak`, Mosaic's
`mosaic_get_memory_usage_peak --snapshot SNAPSHOT`, Mosaic's `mosaic_get_memory_profile
--snapshot SNAPSHOT --profile categories` and, with --diagnose, `allocdoc diagnose SNAPSHOT`, each
with its output thrown away. Each child's wall time is measured around its spawn and reap, and its
peak RSS is the `ru_maxrss` that os.wait4 returns for that child alone (getrusage(RUSAGE_CHILDREN)
would give the largest child so far, not this one). Linux carries the spawning process's peak RSS
into the child at exec (`exec_mmap` keeps the old mm's high-water mark in the child's `maxrss`), so a
child's figure is never below this script's own peak RSS (about 13 MiB): a child at or below that
floor is shown as `<= floor` and ratios against it as `>=`. Prints a Markdown table of medians,
min and max, the ratios Mosaic / allocdoc (median wall time and median peak RSS), the machine and
the commands.

    scripts/top_bench.py --allocdoc target/release/allocdoc --mosaic-python /tmp/mosaic-venv/bin/python \\
        target/tiled-1m.pickle
    # before `allocdoc top` exists, any allocdoc arguments stand in ({snapshot} is replaced):
    scripts/top_bench.py --allocdoc target/release/allocdoc --allocdoc-args 'parse {snapshot}' \\
        --mosaic-python /tmp/mosaic-venv/bin/python --rounds 3 SNAPSHOT

Mosaic's commands are the console scripts next to --mosaic-python (its venv's bin/).
"""

import argparse
import os
import platform
import resource
import shlex
import shutil
import statistics
import sys
import tempfile
import time


def machine():
    model = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{usable} CPUs usable (nproc), {os.cpu_count()} online; {model}; {platform.system()} {platform.release()}"


def own_peak_rss():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # ru_maxrss: KiB on Linux


def run(argv):
    """(wall seconds, CPU seconds, peak RSS bytes, exit code, whether the RSS is only the floor) of one child.

    The CPU seconds (user + system, from the same wait4) are the figure to compare on a shared
    machine: other work stretches the wall time of a two-threaded command more than of a
    one-threaded one."""
    devnull = [(os.POSIX_SPAWN_OPEN, fd, os.devnull, os.O_WRONLY, 0) for fd in (1, 2)]
    floor = own_peak_rss()
    start = time.perf_counter()
    pid = os.posix_spawnp(argv[0], argv, os.environ, file_actions=devnull)
    _, status, usage = os.wait4(pid, 0)
    wall = time.perf_counter() - start
    rss = usage.ru_maxrss * 1024
    return wall, usage.ru_utime + usage.ru_stime, rss, os.waitstatus_to_exitcode(status), rss <= floor


def mib(b):
    return f"{b / (1 << 20):.1f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("snapshot")
    ap.add_argument("--allocdoc", required=True, help="the allocdoc binary")
    ap.add_argument("--allocdoc-args", default="top {snapshot} --at peak",
                    help="arguments of the allocdoc command measured ({snapshot} is replaced)")
    ap.add_argument("--mosaic-python", required=True, help="python of the venv where Mosaic is installed")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--diagnose", action="store_true", help="also time `allocdoc diagnose SNAPSHOT`")
    ap.add_argument("--no-categories", action="store_true",
                    help="leave out Mosaic's categories command (minutes per round)")
    a = ap.parse_args()

    snap = os.path.abspath(a.snapshot)
    bindir = os.path.dirname(os.path.abspath(a.mosaic_python))
    scratch = tempfile.mkdtemp(prefix="top-bench-")
    html = os.path.join(scratch, "mosaic-categories.html")  # the page Mosaic's categories command writes
    allocdoc = [os.path.abspath(a.allocdoc)] + [w.replace("{snapshot}", snap) for w in shlex.split(a.allocdoc_args)]
    commands = [
        ("allocdoc " + a.allocdoc_args.split()[0], allocdoc),
        ("mosaic peak", [os.path.join(bindir, "mosaic_get_memory_usage_peak"), "--snapshot", snap]),
    ]
    if not a.no_categories:
        commands.append(("mosaic categories", [os.path.join(bindir, "mosaic_get_memory_profile"), "--snapshot",
                                               snap, "--profile", "categories", "--out-path", html]))
    if a.diagnose:
        commands.append(("allocdoc diagnose", [os.path.abspath(a.allocdoc), "diagnose", snap]))

    results = {name: [] for name, _ in commands}
    floored = {}  # name -> some run's RSS was only the inherited floor
    for r in range(a.rounds):
        for name, argv in commands:
            wall, cpu, rss, rc, at_floor = run(argv)
            results[name].append((wall, cpu, rss, rc))
            floored[name] = floored.get(name, False) or at_floor
            print(f"round {r + 1}/{a.rounds}: {name}: {wall:.3f} s ({cpu:.3f} s CPU), {mib(rss)} MiB"
                  f"{' (the floor)' if at_floor else ''}, exit {rc}", file=sys.stderr)
    shutil.rmtree(scratch, ignore_errors=True)

    med = {n: tuple(statistics.median(r[i] for r in v) for i in range(3)) for n, v in results.items()}
    le = {n: "<= " if f else "" for n, f in floored.items()}
    size = os.path.getsize(snap)
    print(f"Snapshot: `{a.snapshot}` ({size} bytes). {a.rounds} rounds, interleaved in the order below.\n")
    print(f"Machine: {machine()}.\n")
    print("| command | wall median (s) | wall min-max (s) | CPU median (s) | peak RSS median (MiB) "
          "| peak RSS min-max (MiB) | exit codes |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for name, v in results.items():
        walls, rsss = [r[0] for r in v], [r[2] for r in v]
        codes = ",".join(sorted({str(r[3]) for r in v}))
        print(f"| {name} | {med[name][0]:.3f} | {min(walls):.3f}-{max(walls):.3f} | {med[name][1]:.3f} | "
              f"{le[name]}{mib(med[name][2])} | {le[name]}{mib(min(rsss))}-{mib(max(rsss))} | {codes} |")
    base = commands[0][0]
    print(f"\nRatios (median Mosaic / median `{base}`):\n")
    print("| Mosaic command | wall time ratio | CPU time ratio | peak RSS ratio |")
    print("|---|---:|---:|---:|")
    for name in (n for n in ("mosaic peak", "mosaic categories") if n in med):
        t, c, m = (med[name][i] / med[base][i] if med[base][i] else float("inf") for i in range(3))
        print(f"| {name} | {t:.1f}x | {c:.1f}x | {'>= ' if floored[base] else ''}{m:.1f}x |")
    if any(floored.values()):
        print(f"\n`<=`: at or below this script's own peak RSS ({mib(own_peak_rss())} MiB), which Linux carries into "
              "a child at exec: the child's true peak is at most that (measure it with `/usr/bin/time -f %M`).")
    print("\nCommands:\n")
    for name, argv in commands:
        print(f"- {name}: `{shlex.join(argv)}`")
    if any(r[3] != 0 for v in results.values() for r in v):
        print("\nA command exited non-zero (see the table): check that it did the work before comparing.")


if __name__ == "__main__":
    main()
