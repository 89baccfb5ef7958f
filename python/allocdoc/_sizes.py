"""``allocdoc.capture.record_sizes``: one short snapshot per size of one knob,
for ``allocdoc fit``.

    import allocdoc
    def step(batch):                      # one training step at this batch size
        loss = model(make_batch(batch)).loss
        loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
    allocdoc.capture.record_sizes(step, sizes=[1, 2], knob="batch")

For each size it runs one warm-up step (so the optimizer's state and the
kernels' workspaces exist, as in a real run), then records the allocator's
history around one more step and writes ``<knob><size>.pickle`` (what
``torch.cuda.memory._dump_snapshot`` writes) into ``directory``. Then it prints
the ``allocdoc fit`` command that predicts larger sizes from them. It needs
only PyTorch 2.0 or later with CUDA, as ``allocdoc.capture`` does.
"""

import os
import pickle
import sys
from typing import Any, Callable, List, Optional, Sequence, Tuple

from ._capture import _say, _torch_version, record_history


def record_sizes(
    step: Callable[..., Any],
    sizes: Sequence[int] = (1, 2),
    directory: str = "allocdoc-fit",
    knob: str = "size",
    max_entries: int = 1_000_000,
    stacks: str = "python",
    points: Optional[Sequence[Tuple[int, int]]] = None,
    knobs: Tuple[str, str] = ("a", "b"),
) -> List[str]:
    """Runs ``step(size)`` twice per size (a warm-up, then one recorded step),
    writes one snapshot per size and prints the ``allocdoc fit`` command;
    returns the snapshots' paths (none when PyTorch cannot record).

    With ``points`` (two knobs, e.g. ``[(1, 512), (2, 512), (1, 1024)]`` for a
    batch and a length), runs ``step(a, b)`` at each point instead and prints
    the ``allocdoc fit --points`` command."""
    if points is not None:
        grid = [(int(a), int(b)) for a, b in points]
        if len(grid) < 3 or len(set(grid)) != len(grid) or min(min(p) for p in grid) < 1:
            raise ValueError("points: three or more different (a, b) pairs of whole numbers above 0")
        runs = [(p, (lambda p=p: step(*p)), f"{knobs[0]}{p[0]}_{knobs[1]}{p[1]}") for p in grid]
    else:
        sizes = [int(s) for s in sizes]
        if len(sizes) < 2 or len(set(sizes)) != len(sizes) or min(sizes) < 1:
            raise ValueError("sizes: two or more different whole numbers above 0, e.g. [1, 2]")
        runs = [(z, (lambda z=z: step(z)), f"{knob}{z}") for z in sizes]
    import torch

    version = _torch_version(torch)
    if not torch.cuda.is_available() or version is None or version < (2, 0):
        _say("record_sizes needs PyTorch 2.0 or later with CUDA: nothing is recorded.")
        return []
    os.makedirs(directory, exist_ok=True)
    paths = []
    for at, run, name in runs:
        run()
        torch.cuda.synchronize()
        record_history(torch, version, True, max_entries, stacks)
        try:
            run()
            torch.cuda.synchronize()
            snapshot = torch.cuda.memory._snapshot()
        finally:
            record_history(torch, version, False, max_entries, stacks)
        path = os.path.join(directory, f"{name}.pickle")
        with open(path, "wb") as f:
            pickle.dump(snapshot, f)
        paths.append(path)
        _say(f"recorded {name}: {path}")
    if points is not None:
        command = ("allocdoc fit " + " ".join(paths) + " --points '" + ";".join(f"{a},{b}" for (a, b), _, _ in runs)
                   + f"' --knobs {knobs[0]},{knobs[1]} --capacity <your card>")
    else:
        command = ("allocdoc fit " + " ".join(paths) + f" --sizes {','.join(str(z) for z, _, _ in runs)} --knob {knob}"
                   " --capacity <your card>")
    print(command, file=sys.stderr)
    return paths
