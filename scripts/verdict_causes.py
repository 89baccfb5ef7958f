#!/usr/bin/env python3
"""Compares two runs of `scripts/verdict_diff.sh run` (JSON and exit code per command and fixture):
each changed output with the fields that changed, then the changed outputs grouped by the
issue-26 item (or issue 25/27 change) that explains them.

    scripts/verdict_causes.py OLDDIR NEWDIR     # `scripts/verdict_diff.sh diff` runs this
"""
import collections
import json
import os
import sys

FIELDS_SHOWN = 12


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def flat(v, pre=""):
    """(dotted path, leaf value) of every leaf of a JSON value."""
    if isinstance(v, dict):
        for k, x in v.items():
            yield from flat(x, f"{pre}.{k}" if pre else k)
    elif isinstance(v, list):
        for i, x in enumerate(v):
            yield from flat(x, f"{pre}[{i}]")
    else:
        yield pre, v


def cause(old_rc, new_rc, a, b, changed):
    """The item that explains one changed output."""
    starts = lambda p: any(k.startswith(p) for k in changed)
    if new_rc == "5":
        return f"exit {old_rc}->5: nothing to replay (item 1)"
    if old_rc == "1" and new_rc == "0" and b and "No OOM to avoid" in (b.get("verdict") or ""):
        return "exit 1->0: a summary with no OOM keeps the config in use (item 1)"
    if new_rc == "4" and old_rc != "4":
        return f"exit {old_rc}->4: uncertain (item 4: no cudaMalloc/cudaFree differs, too few plausible workloads, or replays and rules disagree)"
    if old_rc != new_rc:
        return f"exit {old_rc}->{new_rc}: other"
    if starts("answer.diagnosis") or starts("answer.cause"):
        return "same exit, the rules' diagnosis changed (issues 25/27: every device's OOM, observer dumps as full cards, device errors, fills)"
    if starts("candidates[") and a and b and len(a.get("candidates", [])) != len(b.get("candidates", [])):
        return "same exit, a different search space (item 3: one PyTorch version; 2.0+ read as 2.6)"
    if starts("candidates[") or starts("search"):
        return "same exit, candidates ranked or replayed differently (item 5: failures ranked by how far they got; bisection past the request)"
    if "verdict" in changed or "strength" in changed:
        return "same exit, verdict wording (items 2/8: one sentence first, details below; no contradictions)"
    if any("events" in k for k in changed):
        return "same exit, the runs the verdict judged (item 2: validate shows the continued probe)"
    if starts("answer"):
        return "same exit, the rules' answer text (overrides/recommendation wording)"
    return "other: " + ",".join(sorted({k.split(".")[0].split("[")[0] for k in changed}))


def main():
    old, new = sys.argv[1], sys.argv[2]
    groups = collections.defaultdict(list)
    for cmd in ("validate", "recommend"):
        same = changed_count = 0
        for f in sorted(os.listdir(f"{old}/{cmd}")):
            if not f.endswith(".json"):
                continue
            o, n = f"{old}/{cmd}/{f}", f"{new}/{cmd}/{f}"
            rc = lambda p: open(p[:-5] + ".rc").read().strip() if os.path.exists(p[:-5] + ".rc") else ""
            ro, rn = rc(o), rc(n)
            a, b = load(o), load(n)
            if a == b and ro == rn and (a is not None or open(o).read() == open(n).read()):
                same += 1
                continue
            changed_count += 1
            fa, fb = dict(flat(a)) if a else {}, dict(flat(b)) if b else {}
            changed = sorted(k for k in set(fa) | set(fb) if fa.get(k, "<absent>") != fb.get(k, "<absent>"))
            name = f[:-5]
            print(f"== {cmd} {name}: exit {ro} -> {rn}")
            for k in changed[:FIELDS_SHOWN]:
                print(f"  {k}: {str(fa.get(k, '<absent>'))[:160]} -> {str(fb.get(k, '<absent>'))[:160]}")
            if len(changed) > FIELDS_SHOWN:
                print(f"  … {len(changed) - FIELDS_SHOWN} more fields")
            groups[cause(ro, rn, a, b, set(changed))].append(f"{cmd} {name}")
        print(f"{cmd}: {same} unchanged, {changed_count} changed")
    print("\nChanged outputs by cause:")
    for c, v in sorted(groups.items(), key=lambda x: -len(x[1])):
        print(f"{len(v):4d}  {c}\n       e.g. {'; '.join(v[:2])}")


if __name__ == "__main__":
    main()
