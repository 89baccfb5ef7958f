#!/usr/bin/env python3
"""Text-only `recommend` and `validate` on OOM messages of every scale: the benchmark of issue 41
item 1 (each must finish in at most 2 s and 256 MiB on 2 cores, whatever the figures).

Writes one OOM message per (format, card, request) into OUT_DIR, in three eras' formats (1.0-1.3:
"... cached)", 1.4-2.3: "... reserved in total by PyTorch)", 2.4+: "... reserved by PyTorch but
unallocated"), on cards of 8 to 141 GiB, requests from 512 B to 8 GiB (those below the card), with
70 % of the card allocated, 3 % of it cached but unused, and less free memory than the request's
segment; then runs BIN recommend and BIN validate --conf expandable_segments:True on each, timed
(wall seconds and peak RSS, from the OS's accounting of the child), killed past --timeout.

    python3 scripts/text_oom_sweep.py target/release/allocdoc /tmp/sweep [--timeout 20] [--json out.json]

Prints one line per run, then: runs, the worst wall time and peak RSS, how many went over 2 s or
256 MiB, and (with --compare OTHER.json, the --json of another build) how many answers differ
(recommend's line and strength, validate's verdict headline and strength).
"""
import argparse
import json
import os
import subprocess
import sys
import time

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30
CARDS = [8 * GIB, int(15.78 * GIB), int(22.37 * GIB), int(23.65 * GIB), 40 * GIB, int(79.11 * GIB), int(139.8 * GIB)]
REQUESTS = [512, 4 * KIB, 64 * KIB, int(1.12 * MIB), int(2.25 * MIB), 20 * MIB, 256 * MIB, GIB, 8 * GIB]


def size(b):
    """PyTorch's format_size: B, KiB, MiB, GiB with two decimals."""
    if b < 1024:
        return f"{b} bytes"
    if b < 1024 * 1024:
        return f"{b / 1024:.2f} KiB"
    if b < 1024 ** 3:
        return f"{b / 1024 ** 2:.2f} MiB"
    return f"{b / 1024 ** 3:.2f} GiB"


def message(era, card, request):
    allocated = int(card * 0.70)
    cached = int(card * 0.03)
    reserved = allocated + cached
    free = min(request // 2, 2 * MIB) if request >= 2 * MIB else 0
    if era == "1.0":
        return (f"RuntimeError: CUDA out of memory. Tried to allocate {size(request)} (GPU 0; {size(card)} total "
                f"capacity; {size(allocated)} already allocated; {size(free)} free; {size(cached)} cached)")
    if era == "1.4":
        return (f"RuntimeError: CUDA out of memory. Tried to allocate {size(request)} (GPU 0; {size(card)} total "
                f"capacity; {size(allocated)} already allocated; {size(free)} free; {size(reserved)} reserved in "
                f"total by PyTorch) If reserved memory is >> allocated memory try setting max_split_size_mb to avoid "
                f"fragmentation.  See documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF")
    used = card - free
    return (f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {size(request)}. GPU 0 has a total "
            f"capacity of {size(card)} of which {size(free)} is free. Including non-PyTorch memory, this process has "
            f"{size(used)} memory in use. Of the allocated memory {size(allocated)} is allocated by PyTorch, and "
            f"{size(cached)} is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try "
            f"setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for "
            f"Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bin")
    ap.add_argument("out")
    ap.add_argument("--timeout", type=float, default=20.0)
    ap.add_argument("--json", help="write every run's figures and answers here")
    ap.add_argument("--compare", help="the --json of another build: count the answers that differ")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    rows = []
    for era in ("1.0", "1.4", "2.4"):
        for card in CARDS:
            for request in REQUESTS:
                if request >= card * 0.25:
                    continue
                name = f"{era}-{card >> 20}MiB-{request}B.txt"
                path = os.path.join(a.out, name)
                with open(path, "w") as f:
                    f.write(message(era, card, request) + "\n")
                for cmd in (["recommend"], ["validate", "--conf", "expandable_segments:True"]):
                    args = ["/usr/bin/time", "-f", "%e %M", a.bin, *cmd, path, "--format", "json"]
                    start = time.monotonic()
                    p = subprocess.run(["timeout", str(a.timeout)] + args, capture_output=True, text=True)
                    wall = time.monotonic() - start
                    last = (p.stderr.strip().splitlines() or ["0 0"])[-1].split()
                    try:
                        rss = int(last[-1]) / 1024
                    except ValueError:
                        rss = float("nan")
                    answer = {}
                    try:
                        d = json.loads(p.stdout)
                        if cmd[0] == "recommend":
                            r = d.get("recommendation") or {}
                            answer = {"line": r.get("line") if isinstance(r, dict) else None,
                                      "strength": (d.get("verdict") or {}).get("strength") if isinstance(d.get("verdict"), dict) else d.get("strength")}
                        else:
                            v = d.get("verdict")
                            answer = {"verdict": (v.get("finding") if isinstance(v, dict) else v) or "",
                                      "strength": d.get("strength")}
                            answer["verdict"] = answer["verdict"].split("; ")[0]
                    except ValueError:
                        answer = {"error": (p.stdout or "")[:80]}
                    timed_out = p.returncode == 124
                    rows.append({"file": name, "command": cmd[0], "exit": p.returncode, "wall_s": round(wall, 3),
                                 "rss_mib": round(rss, 1), "timed_out": timed_out, "answer": answer})
                    print(f"{name:28} {cmd[0]:9} exit {p.returncode:3} {wall:7.2f} s {rss:8.1f} MiB"
                          f"{'  TIMEOUT' if timed_out else ''}")
                    sys.stdout.flush()
    over = [r for r in rows if r["wall_s"] > 2.0 or r["rss_mib"] > 256 or r["timed_out"]]
    print(f"{len(rows)} runs; worst wall {max(r['wall_s'] for r in rows):.2f} s, worst peak "
          f"{max(r['rss_mib'] for r in rows):.1f} MiB; over 2 s or 256 MiB: {len(over)}")
    if a.json:
        json.dump(rows, open(a.json, "w"), indent=1)
    if a.compare:
        other = {(r["file"], r["command"]): r for r in json.load(open(a.compare))}
        differ = [(r["file"], r["command"], other[(r["file"], r["command"])]["answer"], r["answer"])
                  for r in rows if (r["file"], r["command"]) in other
                  and not other[(r["file"], r["command"])]["timed_out"] and not r["timed_out"]
                  and other[(r["file"], r["command"])]["answer"] != r["answer"]]
        print(f"answers that differ from {a.compare} (both finished): {len(differ)}")
        for d in differ:
            print(f"  {d[0]} {d[1]}: {d[2]} -> {d[3]}")
    sys.exit(1 if over else 0)


if __name__ == "__main__":
    main()
