#!/usr/bin/env python3
"""The speed users feel in a whole command (issues 13 and 15), measured side
by side in one run, rounds interleaved so that load from other jobs hits every
command alike. Each round runs, as whole processes:

  replay    allocdoc replay TRACE --capacity 80GiB           (events/s)
  dynapipe  scripts/dynapipe_replay.py MODEL TRACE            (with --dynapipe MODEL)
  recommend allocdoc recommend TRACE --capacity 80GiB --format json
  parse     allocdoc parse LOG                                (GB/s)
  diagnose  allocdoc diagnose LOG
  text:NAME allocdoc recommend TEXT                           (text only: the ensemble)

Wall time from time.monotonic(), CPU (user + sys) from getrusage of the
children. Prints every run, then medians and the ratios the issues name.

usage: scripts/whole_bench.py BIN TRACE LOG [--rounds N] [--dynapipe MODEL] [TEXT ...]
  TRACE: python3 ../shared/bench/gen_trace.py trace_1m.csv 1000000
  LOG:   python3 ../shared/bench/gen_log.py train_1g.log 1024
Copy BIN first (cp target/release/allocdoc /tmp/allocdoc): see BENCHMARKS.md,
"Measurement trap".
"""
import argparse
import os
import resource
import statistics
import subprocess
import sys
import time


def timed(cmd):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, done.returncode


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bin")
    ap.add_argument("trace")
    ap.add_argument("log")
    ap.add_argument("texts", nargs="*")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--dynapipe")
    a = ap.parse_args()
    here = os.path.dirname(os.path.abspath(__file__))
    commands = [
        ("replay", [a.bin, "replay", a.trace, "--capacity", "80GiB"]),
        ("recommend", [a.bin, "recommend", a.trace, "--capacity", "80GiB", "--format", "json"]),
        ("parse", [a.bin, "parse", a.log]),
        ("diagnose", [a.bin, "diagnose", a.log]),
    ]
    commands += [("text:" + os.path.basename(t), [a.bin, "recommend", t]) for t in a.texts]
    if a.dynapipe:
        commands.append(
            ("dynapipe", [sys.executable, os.path.join(here, "dynapipe_replay.py"), a.dynapipe, a.trace])
        )
    with open(a.trace, "rb") as f:
        events = sum(1 for line in f) - 1
    log_bytes = os.path.getsize(a.log)
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load {os.getloadavg()}, "
          f"{os.cpu_count()} cores, {a.bin}, {events} events, {log_bytes} log bytes")
    runs = {name: [] for name, _ in commands}
    for r in range(a.rounds):
        for name, cmd in commands:
            if name == "dynapipe" and r >= 3:
                continue  # 5 s a run: three are enough for a ratio
            wall, cpu, rc = timed(cmd)
            runs[name].append((wall, cpu))
            print(f"round {r + 1} {name:28} wall {wall:7.3f} s  cpu {cpu:7.3f} s  exit {rc}", flush=True)
    med = {n: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v), min(w for w, _ in v))
           for n, v in runs.items() if v}
    print("\nmedians (wall, cpu, fastest wall):")
    for n, (w, c, f) in med.items():
        print(f"  {n:28} {w:7.3f} s  {c:7.3f} s  {f:7.3f} s")
    w, c, f = med["replay"]
    print(f"replay: {events / w / 1e6:.2f} M events/s of wall (median), {events / f / 1e6:.2f} M (fastest), "
          f"{events / c / 1e6:.2f} M of CPU")
    if "dynapipe" in med:
        print(f"replay vs DynaPipe: {med['dynapipe'][0] / w:.1f}x wall, {med['dynapipe'][1] / c:.1f}x CPU")
    print(f"recommend: {med['recommend'][0]:.3f} s wall median, {med['recommend'][2]:.3f} s fastest")
    pw, dw = med["parse"][0], med["diagnose"][0]
    print(f"diagnose / parse: {dw / pw:.2f}x wall, {med['diagnose'][1] / med['parse'][1]:.2f}x CPU; "
          f"diagnose {log_bytes / dw / 1e9:.2f} GB/s of wall, parse {log_bytes / pw / 1e9:.2f} GB/s")


if __name__ == "__main__":
    main()
