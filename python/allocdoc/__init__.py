"""allocdoc: diagnose PyTorch CUDA out-of-memory failures, recommend a
``PYTORCH_CUDA_ALLOC_CONF``, and prove it by replaying the workload through a
port of PyTorch's caching allocator.

Every function returns the dict that ``allocdoc <command> --format json``
prints, and raises :class:`InputError`, :class:`UsageError` or
:class:`NoDeviceError` (all :class:`Error`) with the command's message::

    import allocdoc
    d = allocdoc.diagnose("train.log")
    print(d["cause"], d["recommendation"] and d["recommendation"]["line"])

``allocdoc.capture`` records the allocator's history in a training script so
the next OOM leaves a snapshot to replay (see its docstring). It needs only
PyTorch; the compiled part of allocdoc is loaded on the first call of a
function below.
"""

from ._capture import capture
from ._sizes import record_sizes as _record_sizes

# allocdoc.capture.record_sizes(step, sizes=[1, 2]): snapshots for `allocdoc fit`.
capture.record_sizes = staticmethod(_record_sizes)

__all__ = [
    "capture",
    "parse",
    "diagnose",
    "replay",
    "recommend",
    "validate",
    "top",
    "diff",
    "fit",
    "forecast",
    "Error",
    "InputError",
    "UsageError",
    "NoDeviceError",
    "SCHEMA_VERSION",
]

_API = frozenset(__all__) - {"capture"}


def __getattr__(name):
    # Loaded on first use, so `allocdoc.capture` in a training job does not
    # load the Rust extension.
    if name in _API:
        from . import _api

        return getattr(_api, name)
    raise AttributeError(f"module 'allocdoc' has no attribute {name!r}")


def __dir__():
    # The lazily loaded functions are part of the module: list them.
    return sorted(set(globals()) | set(__all__))
