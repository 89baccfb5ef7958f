"""The functions of the `allocdoc` package: each runs one command of the Rust
library (`allocdoc._native`, the GIL released while it works) with
`--format json` and returns that JSON as a dict.

`src` is a path (`str` or `os.PathLike`), the input's content as `bytes`, or
its text as a `str`. A `str` is read as a path when it is one line naming an
existing file or looking like a path (a missing one raises `InputError`, as
the command does), and as text otherwise; pass a `pathlib.Path` to make a path
explicit, or `bytes` (`text.encode()`) to make text explicit. Notes the command writes to standard error go to the `allocdoc`
logger (notes at INFO, warnings at WARNING).
"""

import json
import logging
import os
import re
from typing import Any, Dict, Iterable, Optional, Sequence, Tuple, Union

from . import _native
from ._native import SCHEMA_VERSION, Error, InputError, NoDeviceError, UsageError  # noqa: F401 (the package's names)

Source = Union[str, "os.PathLike[str]", bytes, bytearray, memoryview]
#: A size: bytes as an int, or text as the command takes it ("24GiB", "23.5G").
Size = Union[int, str]

_log = logging.getLogger("allocdoc")


def _input(src: Source) -> Tuple[str, Optional[bytes]]:
    """(name, content): content None means "read the file `name`"."""
    if isinstance(src, os.PathLike):
        return os.fspath(src), None
    if isinstance(src, bytes):
        return "<bytes>", src
    if isinstance(src, (bytearray, memoryview)):
        return "<bytes>", bytes(src)
    if isinstance(src, str):
        if "\n" not in src and (os.path.isfile(src) or _looks_like_path(src)):
            return os.path.expanduser(src), None
        return "<string>", src.encode("utf-8")
    raise TypeError(f"expected a path, bytes or str, not {type(src).__name__}")


# A file name's extension: a dot, then up to 8 letters or digits at the end.
_EXTENSION = re.compile(r"\.[A-Za-z0-9]{1,8}$")


def _looks_like_path(line: str) -> bool:
    """Whether one line of text reads as a file's path rather than evidence:
    it starts like a path (/, ~, ./, ../, C:\\) and has no ": " (a log line
    that starts with a file name goes on with one), or it has no whitespace
    and names a directory or ends with an extension. No OOM message, summary
    or stats dump has that shape."""
    s = line.strip()
    if not s:
        return False
    if s.startswith(("/", "~", "./", "../", ".\\", "..\\")) or re.match(r"[A-Za-z]:[\\/]", s):
        return ": " not in s
    return not any(c.isspace() for c in s) and ("/" in s or "\\" in s or bool(_EXTENSION.search(s)))


def _inputs(src: Union[Source, Sequence[Source]]) -> list:
    """One source, or a list or tuple of them (read together, as one incident);
    contents in memory are numbered when there are several."""
    if not isinstance(src, (list, tuple)):
        return [_input(src)]
    found = [_input(s) for s in src]
    if sum(data is not None for _, data in found) < 2:
        return found
    return [
        (f"{name[:-1]} {i}>", data) if data is not None else (name, data)
        for i, (name, data) in enumerate(found, 1)
    ]


def _result(produced: Tuple[str, Iterable[str], int]) -> Dict[str, Any]:
    stdout, notes, _code = produced
    for note in notes:
        _log.log(logging.WARNING if "warning:" in note else logging.INFO, "%s", note)
    return json.loads(stdout)


def parse(src: Union[Source, Sequence[Source]]) -> Dict[str, Any]:
    """The evidence in `src` (`allocdoc parse --format json`)."""
    return _result(_native.parse(_inputs(src)))


def diagnose(
    src: Union[Source, Sequence[Source]],
    torch_version: Optional[str] = None,
    platform: Optional[str] = None,
    conf: Optional[str] = None,
) -> Dict[str, Any]:
    """The cause and the one setting to use (`allocdoc diagnose --format json`).

    torch_version: your PyTorch version when the evidence does not show it.
    platform: "linux", "windows" or "rocm" (default: what the evidence shows,
    else linux); it overrides what the text suggests.
    conf: the PYTORCH_CUDA_ALLOC_CONF in effect at the OOM.
    """
    return _result(_native.diagnose(_inputs(src), torch_version, platform, conf))


def replay(
    trace: Source,
    confs: Sequence[str] = (),
    capacity: Optional[Size] = None,
    fidelity: bool = False,
    torch_version: Optional[str] = None,
) -> Dict[str, Any]:
    """`trace` (a trace CSV, an RMM log or a snapshot pickle) through the bundled
    allocator under each config (`allocdoc replay --format json`): "" is
    PyTorch's defaults; none runs what the command runs without `--conf`."""
    if isinstance(confs, str):
        confs = [confs]
    return _result(_native.replay(_input(trace), list(confs), capacity, fidelity, torch_version))


def recommend(
    src: Source,
    capacity: Optional[Size] = None,
    current: Optional[str] = None,
    torch_version: Optional[str] = None,
    platform: Optional[str] = None,
) -> Dict[str, Any]:
    """The config search by replay (`allocdoc recommend --format json`);
    torch_version and platform as for `diagnose`."""
    return _result(_native.recommend(_input(src), capacity, current, torch_version, platform))


def validate(
    src: Source,
    conf: str,
    current: Optional[str] = None,
    capacity: Optional[Size] = None,
    device: str = "sim",
    torch_version: Optional[str] = None,
    platform: Optional[str] = None,
) -> Dict[str, Any]:
    """The current config against `conf` (`allocdoc validate --format json`);
    torch_version and platform as for `diagnose`."""
    return _result(
        _native.validate(_input(src), conf, current, capacity, device, torch_version, platform)
    )


def top(
    src: Union[Source, Sequence[Source]],
    at: Optional[str] = None,
    by: str = "site",
    n: int = 20,
    device: Optional[int] = None,
) -> Dict[str, Any]:
    """What fills the card in a snapshot (`allocdoc top --format json`): the
    live allocations at the peak, at the trace's OOM and at its end, grouped
    by the code that made them, with their categories and the memory live
    before the trace began.

    at: "peak", "oom", "end", an event index ("1402") or a time since the
    trace's first entry ("2.5s"); by default all three named moments.
    by: "site" (the first frame outside torch, the standard library and C++),
    "user" (also outside site-packages), "stack", "category", "size" or
    "segment". n: rows before the rest is summed. device: one device index.
    A list of snapshots (one per rank) gives the per-rank table instead.
    """
    return _result(_native.top(_inputs(src), at, by, n, device))


def diff(
    before: Source,
    after: Source,
    at: Optional[str] = None,
    by: str = "site",
    n: int = 20,
    device: Optional[int] = None,
) -> Dict[str, Any]:
    """Two snapshots compared at their peak (or at "oom" or "end"), group by
    group and category by category (`allocdoc diff --format json`)."""
    return _result(_native.diff(*_inputs([before, after]), at, by, n, device))


def _points(v: Any) -> Optional[str]:
    """Points as the command takes them: "a,b;a,b" from pairs (or text)."""
    if v is None or isinstance(v, str):
        return v
    return ";".join(f"{int(a)},{int(b)}" for a, b in v)


def fit(
    src: Sequence[Source],
    sizes: Sequence[int] = (),
    at: Sequence[int] = (),
    confs: Sequence[str] = (),
    capacity: Optional[Size] = None,
    step: int = 1,
    knob: str = "size",
    points: Any = None,
    knobs: Optional[Sequence[str]] = None,
    at_points: Any = None,
    along: Optional[Tuple[str, Sequence[int]]] = None,
) -> Dict[str, Any]:
    """How large a size fits (`allocdoc fit --format json`): snapshots of one
    workload recorded at `sizes` of one knob (a batch, a sequence length),
    paired allocation by allocation; the trace predicted at each size in `at`
    replayed as a fresh process under PyTorch's defaults and each of `confs`;
    with `capacity`, the largest multiple of `step` that fits that card under
    each config. `allocdoc.capture.record_sizes` records such snapshots.

    Two knobs: `points` instead of `sizes` (one (a, b) pair per snapshot, at
    least three not on one line), `knobs` their names, `at_points` the pairs
    to predict and, with `capacity`, `along` = (knob, values): for each value,
    the largest value of the other knob that fits (`frontier`).
    """
    return _result(
        _native.fit(_inputs(list(src)), [int(s) for s in sizes], [int(a) for a in at],
                    list(confs), capacity, int(step), knob, _points(points),
                    None if knobs is None else ",".join(knobs), _points(at_points),
                    None if along is None else f"{along[0]}={','.join(str(int(v)) for v in along[1])}")
    )


def _steps(v: Any, name: str) -> Optional[Tuple[str, Optional[bytes]]]:
    """A run or a file of sample sizes: a path, text, or a sequence of ints."""
    if v is None:
        return None
    if isinstance(v, (str, bytes, bytearray, memoryview, os.PathLike)):
        return _input(v)
    return f"<{name}>", "".join(f"{int(z)}\n" for z in v).encode()


def forecast(
    src: Sequence[Source],
    sizes: Sequence[int] = (),
    run: Any = None,
    lengths: Any = None,
    batch: Union[int, str, None] = None,
    steps: Optional[int] = None,
    seed: int = 0,
    pad_to: int = 1,
    confs: Sequence[str] = (),
    capacity: Optional[Size] = None,
    cap_step: Optional[int] = None,
    knob: str = "size",
    points: Any = None,
    knobs: Optional[Sequence[str]] = None,
) -> Dict[str, Any]:
    """A whole run of steps whose size varies (`allocdoc forecast --format
    json`): the recordings `fit` takes, and `run`, each step's size (a list of
    ints, or a file with one per line), or `lengths`, per-sample sizes (a list
    or a file) shuffled with `seed` into batches of `batch`, each step the
    batch's longest sample rounded up to `pad_to` (`steps` steps, default one
    epoch). Replayed as one process under PyTorch's defaults and each of
    `confs` (default: expandable_segments:True): each config's peak reserved
    and the step where it runs out of memory on `capacity`, the config to set
    and the largest cap on the size that carries the run.

    Two knobs: `points` instead of `sizes` (one (batch, size) pair per
    snapshot, as `fit` takes them), `knobs` their names; the run's sizes are
    the second knob's at `batch`, or with `batch="max"` (and `lengths` and
    `capacity`) at the largest batch whose whole run survives the card.
    """
    return _result(
        _native.forecast(_inputs(list(src)), [int(s) for s in sizes], _steps(run, "run"),
                         _steps(lengths, "lengths"), None if batch is None else str(batch), steps,
                         int(seed), int(pad_to), list(confs), capacity, cap_step, knob, _points(points),
                         None if knobs is None else ",".join(knobs))
    )

