"""``allocdoc.capture``: turn a training script's next CUDA out-of-memory error
into a snapshot that ``allocdoc recommend`` can replay.

Two ways in::

    import allocdoc
    allocdoc.capture.install()          # for the whole process, first thing in main()

    with allocdoc.capture():             # or around the code that may run out
        train()

Either starts PyTorch's allocator history (``torch.cuda.memory._record_memory_history``)
with a bounded ring buffer and attaches an out-of-memory observer
(``torch._C._cuda_attach_out_of_memory_observer``). When the caching allocator
is about to raise, the observer writes, into one directory per rank and time:

- ``snapshot.pickle``: ``torch.cuda.memory._snapshot()`` (what ``_dump_snapshot`` writes),
  with the allocator's trace ending in the ``oom`` entry;
- ``memory_stats.json``: ``torch.cuda.memory_stats(device)``;
- ``observer.json``: the figures PyTorch hands the observer, with the snapshot each wrote;

and prints the one ``allocdoc recommend …`` command to run. A later OOM (up to
``max_dumps``) writes its own ``snapshot-2.pickle`` and ``memory_stats-2.json``, and so
on, and names them: the first snapshot, the one the printed command reads, stays. When the
``torch.OutOfMemoryError`` then leaves the ``with`` block (or ends the program,
after ``install()``), its text is added as ``oom.txt``.

Nothing runs per allocation on our side: the only cost while no OOM happens is
PyTorch's own recording (about 2 µs per allocation with Python stacks). The
observer cannot be detached (PyTorch has no call for it); after the capture
stops it returns at once.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import shlex
import sys
import time
import traceback
from typing import Any, Optional

#: Trace entries kept by default: enough for a few training steps of a large
#: model (each entry costs PyTorch a few hundred bytes of host memory plus its stack).
DEFAULT_MAX_ENTRIES = 100_000

#: Full snapshots written per process; later OOMs (cuDNN retries its workspace
#: after one, for example) only append to ``observer.json``.
DEFAULT_MAX_DUMPS = 3

_observer_attached = False
_current: Optional["capture"] = None


def _say(message: str) -> None:
    print(f"allocdoc.capture: {message}", file=sys.stderr, flush=True)


def _torch_version(torch: Any) -> Optional[tuple]:
    """(major, minor) of ``torch.__version__`` ("2.1.2+cu121", "2.4.0a0+git…")."""
    m = re.match(r"(\d+)\.(\d+)", str(getattr(torch, "__version__", "")))
    return (int(m.group(1)), int(m.group(2))) if m else None


def _rank(torch: Any) -> int:
    """The global rank: torchrun's RANK, else torch.distributed's, else 0."""
    rank = os.environ.get("RANK")
    if rank is not None and rank.isdigit():
        return int(rank)
    dist = getattr(torch, "distributed", None)
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return int(dist.get_rank())
    except Exception:
        pass
    return 0


def _oom_error_types(torch: Any) -> tuple:
    """``torch.OutOfMemoryError`` (2.4+) and ``torch.cuda.OutOfMemoryError``
    (1.13+; the same class from 2.4 on)."""
    found = []
    for owner in (torch, getattr(torch, "cuda", None)):
        t = getattr(owner, "OutOfMemoryError", None)
        if isinstance(t, type) and t not in found:
            found.append(t)
    return tuple(found)


def _current_conf() -> Optional[str]:
    for name in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        value = os.environ.get(name)
        if value:
            return value
    return None


def _write_atomically(path: str, write) -> None:
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        write(f)
    os.replace(tmp, path)


def _on_oom(device: int, alloc: int, allowed: int, device_free: int) -> None:
    """The observer PyTorch calls before raising (CUDACachingAllocator.cpp,
    ``DeviceCachingAllocator::malloc``): ``(device, alloc_size, allowed memory
    (set_per_process_memory_fraction) or the device total, device_free)``. It must
    never raise: an exception here would replace the OOM error."""
    cap = _current
    if cap is None:
        return
    try:
        cap._record_oom(device, alloc, allowed, device_free)
    except BaseException as e:  # noqa: BLE001 - see the docstring
        _say(f"could not write the out-of-memory snapshot: {type(e).__name__}: {e}")


def record_history(torch: Any, version: tuple, on: bool, max_entries: int, stacks: str) -> None:
    """Turns PyTorch's allocator history on or off, in the call form of each
    version (torch/cuda/memory.py). 2.0: ``_record_memory_history(enabled:
    bool, record_context=True, trace_alloc_max_entries=1,
    trace_alloc_record_context=False, …)``; 2.1 on:
    ``_record_memory_history(enabled="all", context="all", stacks="all",
    max_entries=sys.maxsize, …)``, where a bool still takes the 2.0 path."""
    record = torch.cuda.memory._record_memory_history
    if version == (2, 0):
        if on:
            record(
                True,
                record_context=True,
                trace_alloc_max_entries=max_entries,
                trace_alloc_record_context=True,
            )
        else:
            record(False)
    elif on:
        record("all", context="all", stacks=stacks, max_entries=max_entries)
    else:
        record(None)


class capture:
    """Records the CUDA caching allocator's history and writes a snapshot at the
    next out-of-memory error. A context manager; ``capture.install()`` starts one
    for the whole process.

    directory: where incident directories go (default ``$ALLOCDOC_CAPTURE_DIR``,
    else ``./allocdoc-oom``). max_entries: trace entries PyTorch keeps (a ring
    buffer: the newest win). stacks: ``"python"`` (cheap) or ``"all"`` (adds C++
    frames; PyTorch 2.1+; slow to record and to dump). max_dumps: full snapshots
    written per process.
    """

    def __init__(
        self,
        directory: Optional[str] = None,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        stacks: str = "python",
        max_dumps: int = DEFAULT_MAX_DUMPS,
    ) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        self.directory = directory or os.environ.get("ALLOCDOC_CAPTURE_DIR") or "allocdoc-oom"
        self.max_entries = int(max_entries)
        self.stacks = stacks
        self.max_dumps = int(max_dumps)
        #: True while PyTorch records for this capture.
        self.recording = False
        #: The incident directory, once an OOM was seen.
        self.incident: Optional[str] = None
        self.dumps = 0
        #: The PYTORCH_CUDA_ALLOC_CONF in effect (read when the capture starts,
        #: as PyTorch reads it once at CUDA initialization).
        self.conf: Optional[str] = None
        self._torch: Any = None
        self._version: Optional[tuple] = None

    # -- starting and stopping -------------------------------------------------

    def start(self) -> bool:
        """Starts recording; says on standard error what it did and returns
        whether PyTorch is recording."""
        global _current, _observer_attached
        try:
            import torch
        except ImportError:
            _say("PyTorch is not installed: nothing is recorded.")
            return False
        self._torch = torch
        if not torch.cuda.is_available():
            _say("CUDA is not available: nothing is recorded.")
            return False
        version = _torch_version(torch)
        self._version = version
        if version is None or version < (2, 0):
            _say(
                f"PyTorch {torch.__version__} cannot record an allocation trace "
                "(torch.cuda.memory._record_memory_history keeps one from 2.0 on): nothing is recorded."
            )
            return False
        backend = getattr(torch.cuda, "get_allocator_backend", lambda: "native")()
        if backend != "native":
            _say(
                f"the {backend} allocator backend keeps no history (only the native caching "
                "allocator does): nothing is recorded."
            )
            return False
        attach = getattr(torch._C, "_cuda_attach_out_of_memory_observer", None)
        if attach is None:
            _say(
                f"PyTorch {torch.__version__} has no out-of-memory observer "
                "(torch._C._cuda_attach_out_of_memory_observer): nothing is recorded."
            )
            return False
        try:
            # Attaching the observer before CUDA is initialized crashes the
            # process (pytorch#107330): initialize first.
            torch.cuda.init()
            self._record(True)
        except Exception as e:
            _say(f"PyTorch {torch.__version__} refused to record: {type(e).__name__}: {e}")
            return False
        self.recording = True
        self.conf = _current_conf()
        _current = self
        if not _observer_attached:
            attach(_on_oom)
            _observer_attached = True
        _say(
            f"recording the CUDA allocator's last {self.max_entries} events (PyTorch "
            f"{torch.__version__}); an out-of-memory error writes a snapshot under "
            f"{os.path.abspath(self.directory)}"
        )
        return True

    def stop(self) -> None:
        """Stops PyTorch's recording (the observer stays attached and idle)."""
        global _current
        if self.recording:
            try:
                self._record(False)
            except Exception as e:
                _say(f"could not stop recording: {type(e).__name__}: {e}")
            self.recording = False
        if _current is self:
            _current = None

    def _record(self, on: bool) -> None:
        record_history(self._torch, self._version, on, self.max_entries, self.stacks)

    def __enter__(self) -> "capture":
        self.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc is not None:
            self.note_exception(exc)
        self.stop()

    @classmethod
    def install(cls, **kwargs: Any) -> "capture":
        """Starts a capture for the rest of the process (a second call returns the
        first capture) and adds the OOM text when an out-of-memory error ends it."""
        if _current is not None:
            return _current
        cap = cls(**kwargs)
        if cap.start():
            previous = sys.excepthook

            def hook(exc_type, exc, tb):
                cap.note_exception(exc)
                previous(exc_type, exc, tb)

            sys.excepthook = hook
        return cap

    # -- at the out-of-memory error --------------------------------------------

    def note_exception(self, exc: BaseException) -> None:
        """Writes ``oom.txt`` (the exception as Python prints it) when ``exc`` is
        the out-of-memory error whose snapshot this capture wrote."""
        if self.incident is None or self._torch is None:
            return
        if not isinstance(exc, _oom_error_types(self._torch)):
            return
        text = "".join(traceback.format_exception_only(type(exc), exc))
        path = os.path.join(self.incident, "oom.txt")
        try:
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
        except OSError as e:
            _say(f"could not write {path}: {e}")

    def _record_oom(self, device: int, alloc: int, allowed: int, device_free: int) -> None:
        torch = self._torch
        first = self.incident is None
        if first:
            stamp = time.strftime("%Y%m%d-%H%M%S")
            name = f"rank{_rank(torch)}-{stamp}-pid{os.getpid()}"
            self.incident = os.path.join(self.directory, name)
            os.makedirs(self.incident, exist_ok=True)
        dump = self.dumps < self.max_dumps
        # Each dump its own files: the first keeps the names the printed command reads.
        suffix = "" if self.dumps == 0 else f"-{self.dumps + 1}"
        snapshot_path = os.path.join(self.incident, f"snapshot{suffix}.pickle")
        event = {
            "device": device,
            "snapshot": snapshot_path if dump else None,
            "requested_bytes": alloc,
            "allowed_bytes": allowed,
            "device_free_bytes": device_free,
            "time": time.time(),
            "torch_version": str(torch.__version__),
            "conf": self.conf,
        }
        events_path = os.path.join(self.incident, "observer.json")
        events = []
        if not first and os.path.exists(events_path):
            with open(events_path, encoding="utf-8") as f:
                events = json.load(f)
        events.append(event)
        with open(events_path, "w", encoding="utf-8") as f:
            json.dump(events, f, indent=1)
        if not dump:
            return
        self.dumps += 1
        snapshot = torch.cuda.memory._snapshot()
        _write_atomically(
            snapshot_path,
            lambda f: pickle.dump(snapshot, f, protocol=pickle.HIGHEST_PROTOCOL),
        )
        stats = dict(torch.cuda.memory_stats(device))
        _write_atomically(
            os.path.join(self.incident, f"memory_stats{suffix}.json"),
            lambda f: f.write(json.dumps(stats, indent=1).encode()),
        )
        if not first:
            _say(
                f"another CUDA out-of-memory error on cuda:{device} (asked for {alloc} bytes): "
                f"wrote {snapshot_path}; the first snapshot is kept. To replay this one:\n"
                f"  {self.command(snapshot_path)}"
            )
        if first:
            _say(
                f"CUDA out of memory on cuda:{device} (asked for {alloc} bytes): wrote "
                f"{self.incident}. Find the PYTORCH_CUDA_ALLOC_CONF that avoids it with:\n"
                f"  {self.command()}"
            )

    def command(self, snapshot: Optional[str] = None) -> str:
        """The ``allocdoc recommend`` command for a captured snapshot (the first
        one unless ``snapshot`` names another)."""
        if self.incident is None:
            raise RuntimeError("no out-of-memory error was captured")
        path = snapshot or os.path.join(self.incident, "snapshot.pickle")
        args = ["allocdoc", "recommend", path]
        if self.conf:
            args += ["--current", self.conf]
        return shlex.join(args)
