#!/usr/bin/env python3
"""An independent computation of allocdoc `top`'s attribution, from docs/ATTRIBUTION.md.

It shares no code with allocdoc: a reference for tests, written for reading, not for speed
(pure Python 3.9+, stdlib only). Snapshots are loaded with an unpickler that refuses every
global, so a pickle holding anything but plain data fails to load.

For each device with trace entries (or --device D) it prints JSON: for the moments peak, oom
(when the trace has an `oom` entry) and end (or only --at EVENT / --time T), the event index,
the allocated bytes A(i), the memory live before the trace began (split into what is still live
at the end and what the trace frees later), the top N rows under --by site|user|stack|category
with bytes, count and share, the `<live before the trace began>` row, the rest summed, and the
bytes per category. --growth adds the sites whose live bytes rise across step boundaries.

    scripts/attribution_oracle.py fixtures/snapshots/magma27-assignment2-systems_memory_snapshot.pickle
    scripts/attribution_oracle.py SNAP --by category --top 10
    scripts/attribution_oracle.py fixtures/snapshots/gen-growth-leak.pickle --growth
"""

import argparse
import json
import pickle
import re
import sys

PRE_TRACE = "<live before the trace began>"
NO_PYTHON = "<no Python frame>"
NO_STACK = "<no stack recorded>"
LIVE_STATES = ("active_allocated", "active_pending_free", "active_awaiting_free")
STDLIB = re.compile(r"/(lib|lib64|Lib)/python[0-9.]*/")
NEVER = float("inf")


class DataOnly(pickle.Unpickler):
    """Plain dicts, lists, tuples, str, numbers only: every global is refused."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"refused global {module}.{name}")


def load(path):
    with open(path, "rb") as f:
        return DataOnly(f).load()


# ---------------------------------------------------------------- frames and sites

def norm(frame):
    return str(frame.get("filename", "")).replace("\\", "/")


def is_python(frame):
    return norm(frame).endswith(".py")


def is_torch(frame):
    p = norm(frame)
    return "/torch/" in p or p.startswith("torch/")


def is_package(frame):
    p = norm(frame)
    return "/site-packages/" in p or "/dist-packages/" in p


def is_stdlib(frame):
    p = norm(frame)
    return (STDLIB.search(p) is not None or "/Lib/" in p) and not is_package(frame)


def frame_key(frame):
    return (str(frame.get("filename", "")), frame.get("line", 0), str(frame.get("name", "")))


def short(filename):
    p = filename.replace("\\", "/")
    cut = max(p.rfind("/site-packages/") + len("/site-packages/") if "/site-packages/" in p else -1,
              p.rfind("/dist-packages/") + len("/dist-packages/") if "/dist-packages/" in p else -1)
    return p[cut:] if cut >= 0 else p.rsplit("/", 1)[-1]


def show(key):
    filename, line, name = key
    if filename in (PRE_TRACE, NO_PYTHON, NO_STACK):
        return filename
    return f"{short(filename)}:{line}:{name}"


def pseudo(label):
    """A row that is not a frame; its key sorts with the frame keys by its label."""
    return (label, 0, "")


def site_key(frames, by):
    python = [f for f in frames if is_python(f)]
    outside = [f for f in python if not is_torch(f) and not is_stdlib(f)]
    if by == "user":
        mine = [f for f in outside if not is_package(f)]
        if mine:
            return frame_key(mine[0])
    if outside:
        return frame_key(outside[0])
    if python:
        return frame_key(python[0])
    return pseudo(NO_PYTHON if frames else NO_STACK)


def stack_key(frames):
    """--by stack: the whole recorded stack (the spec does not define this grouping further)."""
    if not frames:
        return pseudo(NO_STACK)
    text = " <- ".join(show(frame_key(f)) for f in frames)
    return (text, 0, "")


# ---------------------------------------------------------------- categories

OPTIM_DIRS = ("/torch/optim/", "/torch/distributed/optim/", "/apex/optimizers/", "/bitsandbytes/optim/",
              "/deepspeed/ops/adam/", "/torchao/optim/")
NN_PARAM_NAMES = ("__init__", "reset_parameters", "_apply", "to", "cuda", "_load_from_state_dict")


def in_file(frame, tail):
    """The frame's normalised path is `tail` or ends with `/tail`."""
    p = norm(frame)
    return p == tail or p.endswith("/" + tail)


def rule_class(frames):
    """1 optimizer, 2 backward, 3 parameters, 4 activations, 5 unknown (first match wins)."""
    for f in frames:
        p, name = norm(f), str(f.get("name", ""))
        if is_python(f) and (any(d in p for d in OPTIM_DIRS) or p.endswith("/transformers/optimization.py")):
            return 1
        if name == "step" and "optim" in str(f.get("filename", "")).lower():
            return 1
    for f in frames:
        name = str(f.get("name", ""))
        if name == "backward" and (in_file(f, "torch/_tensor.py") or in_file(f, "torch/autograd/__init__.py")):
            return 2
        if name == "grad" and in_file(f, "torch/autograd/__init__.py"):
            return 2
        if name == "_engine_run_backward" and in_file(f, "torch/autograd/graph.py"):
            return 2
        if not is_python(f) and ("torch::autograd::Engine::" in name or "AccumulateGrad" in name):
            return 2
    for f in frames:
        p, name = norm(f), str(f.get("name", ""))
        if name in NN_PARAM_NAMES and ("/torch/nn/" in p or p.startswith("torch/nn/")):
            return 3
        if "load_state_dict" in name or "from_pretrained" in name or name == "_load_pretrained_model":
            return 3
        if in_file(f, "torch/nn/parameter.py"):
            return 3
    for f in frames:
        name = str(f.get("name", ""))
        if name == "forward":
            return 4
        if name in ("_call_impl", "_wrapped_call_impl") and in_file(f, "torch/nn/modules/module.py"):
            return 4
    return 5


def has_accumulate_grad(frames):
    return any(not is_python(f) and "AccumulateGrad" in str(f.get("name", "")) for f in frames)


def category(alloc):
    c = alloc["class"]
    if c == 1:
        return "optimizer_state" if alloc["outlives"] else "optimizer_temporaries"
    if c == 2:
        return "gradients" if alloc["outlives"] or has_accumulate_grad(alloc["frames"]) else "backward_temporaries"
    return {3: "parameters", 4: "activations", 5: "unknown"}[c]


# ---------------------------------------------------------------- the live set of one device

def block_addresses(segment):
    """(block, address): `address` when recorded, else the segment's plus the sizes before it."""
    at = segment.get("address", 0)
    for b in segment.get("blocks", []) or []:
        yield b, b.get("address", at)
        at += b.get("size", 0)


class Device:
    """Every allocation of one device's trace and end state as an interval [start, end) of states.

    State i is the state after entry i; -1 is the state before the first entry. An allocation is
    live at state i when start <= i < end. Traced allocations start at their `alloc` entry and end
    at the `free_completed` that frees them (or the `alloc` that reuses their address); pre-trace
    allocations start at -1.
    """

    def __init__(self, snap, device):
        traces = snap.get("device_traces", []) if isinstance(snap, dict) else []
        self.trace = traces[device] if device < len(traces) and traces[device] else []
        segments = snap.get("segments", []) if isinstance(snap, dict) else snap
        self.segments = [s for s in segments if s.get("device", 0) == device]
        self.annotations = (snap.get("external_annotations") or []) if isinstance(snap, dict) else []
        self.device = device
        self.n = len(self.trace)
        self.notes = []
        self.allocs = []
        self._build()
        self._phases()
        self._levels()

    def _build(self):
        live = {}  # addr -> traced allocation record
        dropped = 0
        for i, e in enumerate(self.trace):
            action, addr = e.get("action"), e.get("addr")
            if action == "alloc":
                if addr in live:
                    live[addr]["end"] = i
                    dropped += 1
                a = {"start": i, "end": NEVER, "size": e.get("size", 0), "frames": e.get("frames") or [],
                     "kind": "traced"}
                live[addr] = a
                self.allocs.append(a)
            elif action == "free_completed":
                if addr in live:
                    live.pop(addr)["end"] = i
                else:
                    self.allocs.append({"start": -1, "end": i, "size": e.get("size", 0), "frames": [],
                                        "kind": "pre_trace_freed"})
        if dropped:
            self.notes.append(f"{dropped} alloc entries at an address already live: the earlier one dropped")
        for seg in self.segments:
            for b, addr in block_addresses(seg):
                if b.get("state") in LIVE_STATES and addr not in live:
                    self.allocs.append({"start": -1, "end": NEVER,
                                        "size": b.get("requested_size", b.get("size", 0)),
                                        "frames": b.get("frames") or [], "kind": "pre_trace_live"})

    def _phases(self):
        """Rule class per allocation, and whether an optimizer/backward one outlives its phase."""
        by_id = {}
        for a in self.allocs:
            f = a["frames"]
            if id(f) not in by_id:
                by_id[id(f)] = rule_class(f)
            a["class"] = by_id[id(f)]
        traced = [a for a in self.allocs if a["kind"] == "traced"]  # in entry order
        # j: the first later alloc whose class differs from this one's (n if none).
        next_diff = self.n
        for k in range(len(traced) - 1, -1, -1):
            a = traced[k]
            if k + 1 < len(traced):
                b = traced[k + 1]
                next_diff = b["start"] if b["class"] != a["class"] else b["j"]
            a["j"] = next_diff
            a["outlives"] = a["end"] > a["j"]
        for a in self.allocs:
            if a["kind"] != "traced":
                a["outlives"] = True

    def _levels(self):
        """A(i) for i in -1..n-1, from the size changes at each entry."""
        delta = [0] * (self.n + 1)  # delta[i + 1]: the change applied by entry i
        base = 0
        for a in self.allocs:
            if a["start"] == -1:
                base += a["size"]
            else:
                delta[a["start"] + 1] += a["size"]
            if a["end"] != NEVER:
                delta[a["end"] + 1] -= a["size"]
        self.level = []  # level[i + 1] = A(i)
        total = base
        for i in range(self.n + 1):
            total += delta[i]
            self.level.append(total)

    def A(self, i):
        return self.level[i + 1]

    def pre_trace_at_end(self):
        return sum(a["size"] for a in self.allocs if a["kind"] == "pre_trace_live")

    # ------------------------------------------------------------ moments

    def peak(self):
        changes = any(e.get("action") in ("alloc", "free_completed") for e in self.trace)
        if not changes:
            return self.n - 1
        best = max(range(self.n), key=lambda i: (self.A(i), -i))
        return best

    def oom(self):
        ks = [k for k, e in enumerate(self.trace) if e.get("action") == "oom"]
        return ks[-1] - 1 if ks else None

    def at_time(self, t):
        last = -1
        for i, e in enumerate(self.trace):
            if e.get("time_us", NEVER) <= t:
                last = i
        return last

    # ------------------------------------------------------------ attribution at state i

    def live_at(self, i):
        return [a for a in self.allocs if a["start"] <= i < a["end"]]

    def attribute(self, i, by, top):
        live = self.live_at(i)
        total = self.A(i)
        share = (lambda b: b / total) if total else (lambda b: 0.0)
        rows, pre_row = {}, {"bytes": 0, "count": 0}
        pre_live = pre_freed = 0
        cats = {}
        for a in live:
            if a["kind"] == "pre_trace_live":
                pre_live += a["size"]
            elif a["kind"] == "pre_trace_freed":
                pre_freed += a["size"]
            c = cats.setdefault(category(a), {"bytes": 0, "count": 0, "pre_trace_bytes": 0})
            c["bytes"] += a["size"]
            c["count"] += 1
            if a["kind"] != "traced":
                c["pre_trace_bytes"] += a["size"]
            if by == "category":
                key = pseudo(category(a))
            elif a["kind"] != "traced" and not a["frames"]:
                pre_row["bytes"] += a["size"]
                pre_row["count"] += 1
                continue
            elif by == "stack":
                key = stack_key(a["frames"])
            else:
                key = site_key(a["frames"], by)
            r = rows.setdefault(key, {"bytes": 0, "count": 0})
            r["bytes"] += a["size"]
            r["count"] += 1
        order = sorted(rows.items(), key=lambda kv: (-kv[1]["bytes"], kv[0]))
        shown = [{"site": show(k) if by != "category" else k[0], "key": list(k), "bytes": r["bytes"],
                  "count": r["count"], "share": round(share(r["bytes"]), 6)} for k, r in order[:top]]
        rest = order[top:]
        out = {
            "event_index": i,
            "allocated_bytes": total,
            "pre_trace": {"bytes": pre_live + pre_freed, "live_at_end_bytes": pre_live,
                          "freed_in_trace_bytes": pre_freed},
            "by": by,
            "top": shown,
            "rest": {"rows": len(rest), "bytes": sum(r["bytes"] for _, r in rest),
                     "count": sum(r["count"] for _, r in rest)},
            "categories": [dict(category=k, **v) for k, v in
                           sorted(cats.items(), key=lambda kv: (-kv[1]["bytes"], kv[0]))],
        }
        if by != "category":
            out["pre_trace_row"] = dict(site=PRE_TRACE, share=round(share(pre_row["bytes"]), 6), **pre_row)
        assert sum(r["bytes"] for r in rows.values()) + pre_row["bytes"] == total, "rows must sum to A(i)"
        return out

    # ------------------------------------------------------------ growth across steps

    def alloc_entries(self):
        return [i for i, e in enumerate(self.trace) if e.get("action") == "alloc"]

    def step_starts(self):
        """Alloc numbers (0 = the first alloc of the trace) where each step begins, and the source.

        As allocdoc's trace_metrics: step annotations' START times (name containing "step", any case,
        this device), each marking the first alloc at or after the first entry timed at or after it;
        the first mark is dropped (what precedes it joins the first step). Else cycles of allocated
        memory: levels before each alloc, a step starting at the last alloc at the bottom (within a
        tenth of the 5th-95th percentile range) before each rise above the middle, the first such rise
        joining the first step.
        """
        allocs = self.alloc_entries()
        times = sorted(a["time_us"] for a in self.annotations
                       if a.get("stage") == "START" and "step" in str(a.get("name", "")).lower()
                       and a.get("device", self.device) == self.device and "time_us" in a)
        marks, t = [], 0
        count = 0
        for e in self.trace:
            tu = e.get("time_us", 0)
            if tu:
                while t < len(times) and times[t] <= tu:
                    marks.append(count)
                    t += 1
            if e.get("action") == "alloc":
                count += 1
        bounds = [m for m in marks[1:] if 0 < m < len(allocs)]
        if bounds:
            return [0] + sorted(set(bounds)), "annotations"
        levels = [self.A(i - 1) for i in allocs]  # allocated memory before each alloc
        cut = cycle_starts(levels, self.A(self.n - 1))
        return ([0] + cut, "allocated_cycles") if cut else ([0], "none")

    def growth(self, by):
        allocs = self.alloc_entries()
        starts, source = self.step_starts()
        states = [allocs[s] - 1 for s in starts]  # the live set just before each step's first alloc
        per_site = {}
        for k, i in enumerate(states):
            for a in self.live_at(i):
                if a["kind"] != "traced" and not a["frames"]:
                    key = pseudo(PRE_TRACE)
                elif by == "stack":
                    key = stack_key(a["frames"])
                else:
                    key = site_key(a["frames"], "user" if by == "user" else "site")
                per_site.setdefault(key, [0] * len(states))[k] += a["size"]
        # What each site still holds at the trace's end: a rise gone by then grew inside one step.
        at_end = {}
        for a in self.live_at(self.n - 1):
            if a["kind"] == "traced":
                key = stack_key(a["frames"]) if by == "stack" else site_key(a["frames"], "user" if by == "user" else "site")
                at_end[key] = at_end.get(key, 0) + a["size"]
        found = []
        for key, values in per_site.items():
            run = longest_rising_run(values)
            if run is None:
                continue
            s0, s1 = run
            if at_end.get(key, 0) < values[s1]:
                continue
            found.append({"site": show(key), "key": list(key), "first_step": s0, "last_step": s1,
                          "first_bytes": values[s0], "last_bytes": values[s1],
                          "bytes_per_step": (values[s1] - values[s0]) / (s1 - s0)})
        found.sort(key=lambda g: (-g["bytes_per_step"], g["key"]))
        return {"step_source": source, "steps": len(starts),
                "step_first_alloc_entries": [allocs[s] for s in starts] if allocs else [],
                "growing_sites": found}


def cycle_starts(levels, end):
    """trace_metrics' step_starts: alloc numbers where a step starts after the first."""
    every = max(len(levels) // 4096, 1)
    sample = sorted(levels[::every] + [end])
    at = lambda q: sample[len(sample) * q // 100] if sample else 0  # noqa: E731
    lo, hi = at(5), at(95)
    span = hi - lo
    if span <= 0:
        return []
    # Integer halves and tenths, as the Rust does with i128 division (span > 0, so floor = trunc).
    up, down = lo + span // 2, lo + span // 10
    high, from_bottom, rises, out = False, None, 0, []
    for k, v in enumerate(levels):
        if v <= down:
            high, from_bottom = False, k
        elif not high and v >= up:
            high = True
            if from_bottom is not None:
                rises += 1
                if rises > 1:
                    out.append(from_bottom)
                from_bottom = None
    return out


def longest_rising_run(values):
    """(first, last) step of the longest run of strict rises at consecutive boundaries (>= 2 rises)."""
    best, start = None, 0
    for k in range(1, len(values) + 1):
        if k == len(values) or values[k] <= values[k - 1]:
            if k - 1 - start >= 2 and (best is None or k - 1 - start > best[1] - best[0]):
                best = (start, k - 1)
            start = k
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("snapshot")
    ap.add_argument("--device", type=int, action="append", help="device index (repeatable; default: "
                    "every device with trace entries)")
    ap.add_argument("--by", choices=("site", "user", "stack", "category"), default="site")
    ap.add_argument("--top", type=int, default=5)
    ap.add_argument("--at", type=int, help="only the state after this entry index")
    ap.add_argument("--time", type=float, help="only the state after the last entry with time_us <= T")
    ap.add_argument("--growth", action="store_true", help="add the sites growing across steps")
    a = ap.parse_args()
    snap = load(a.snapshot)
    traces = snap.get("device_traces", []) if isinstance(snap, dict) else []
    devices = a.device if a.device is not None else [d for d, t in enumerate(traces) if t]
    out = {"snapshot": a.snapshot, "devices": []}
    for d in devices:
        dev = Device(snap, d)
        if a.at is not None:
            moments = {"event": a.at}
        elif a.time is not None:
            moments = {"time": dev.at_time(a.time)}
        else:
            moments = {"peak": dev.peak()}
            if dev.oom() is not None:
                moments["oom"] = dev.oom()
            moments["end"] = dev.n - 1
        rec = {"device": d, "entries": dev.n, "notes": dev.notes,
               "pre_trace_live_at_end_bytes": dev.pre_trace_at_end(),
               "moments": {m: dev.attribute(i, a.by, a.top) for m, i in moments.items()}}
        if a.growth:
            rec["growth"] = dev.growth(a.by)
        out["devices"].append(rec)
    json.dump(out, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
