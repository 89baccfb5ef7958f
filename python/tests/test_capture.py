"""allocdoc.capture's control flow against a stand-in ``torch`` that records
every call (no GPU, no PyTorch needed). The last test runs the printed
``allocdoc recommend`` command on a snapshot with a recorded OOM when the
``allocdoc`` command is installed."""

import contextlib
import io
import json
import os
import pickle
import shlex
import shutil
import subprocess
import sys
import tempfile
import types
import unittest
from unittest import mock

import allocdoc
from allocdoc import _capture

GIB = 1 << 30


class FakeOutOfMemoryError(RuntimeError):
    pass


FakeOutOfMemoryError.__module__ = "torch"
FakeOutOfMemoryError.__qualname__ = "OutOfMemoryError"


def fake_torch(version="2.6.0+cu124", cuda=True, backend="native", snapshot=None, refuse=None):
    """A module shaped like the parts of torch the capture touches; `calls`
    lists every call made to it."""
    calls = []
    torch = types.ModuleType("torch")
    torch.__version__ = version
    torch.calls = calls
    torch.observers = []
    torch.OutOfMemoryError = FakeOutOfMemoryError

    def record(*args, **kwargs):
        calls.append(("_record_memory_history", args, kwargs))
        if refuse is not None:
            raise RuntimeError(refuse)

    def snap():
        calls.append(("_snapshot", (), {}))
        return snapshot if snapshot is not None else {"segments": [], "device_traces": [[]]}

    def memory_stats(device=None):
        calls.append(("memory_stats", (device,), {}))
        return {"num_ooms": 1, "reserved_bytes.all.current": 2 * GIB}

    def attach(observer):
        calls.append(("_cuda_attach_out_of_memory_observer", (observer,), {}))
        torch.observers.append(observer)

    def init():
        calls.append(("init", (), {}))

    torch.cuda = types.SimpleNamespace(
        init=init,
        is_available=lambda: cuda,
        get_allocator_backend=lambda: backend,
        memory=types.SimpleNamespace(_record_memory_history=record, _snapshot=snap),
        memory_stats=memory_stats,
        OutOfMemoryError=FakeOutOfMemoryError,
    )
    torch._C = types.SimpleNamespace(_cuda_attach_out_of_memory_observer=attach)
    torch.distributed = types.SimpleNamespace(
        is_available=lambda: True, is_initialized=lambda: False, get_rank=lambda: 0
    )
    return torch


class CaptureTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="allocdoc-capture-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        # Each test starts with no observer attached and no capture running.
        patcher = mock.patch.multiple(_capture, _observer_attached=False, _current=None)
        patcher.start()
        self.addCleanup(patcher.stop)
        env = mock.patch.dict(os.environ, {"RANK": "3"})
        env.start()
        self.addCleanup(env.stop)
        os.environ.pop("PYTORCH_CUDA_ALLOC_CONF", None)
        os.environ.pop("PYTORCH_ALLOC_CONF", None)

    def start(self, torch, **kwargs):
        """Starts a capture against `torch`; returns it and what it said."""
        err = io.StringIO()
        kwargs.setdefault("directory", self.dir)
        with mock.patch.dict(sys.modules, {"torch": torch}), contextlib.redirect_stderr(err):
            cap = allocdoc.capture(**kwargs)
            cap.start()
        return cap, err.getvalue()

    def records(self, torch):
        return [(a, k) for name, a, k in torch.calls if name == "_record_memory_history"]

    def test_cuda_is_initialized_before_the_observer_is_attached(self):
        torch = fake_torch()
        cap, _ = self.start(torch)
        names = [c[0] for c in torch.calls]
        self.assertEqual(names, ["init", "_record_memory_history", "_cuda_attach_out_of_memory_observer"])
        cap.stop()

    def test_a_build_without_the_observer_records_nothing(self):
        torch = fake_torch()
        torch._C = types.SimpleNamespace()
        cap, said = self.start(torch)
        self.assertFalse(cap.recording)
        self.assertEqual(torch.calls, [])
        self.assertIn("has no out-of-memory observer", said)

    def test_2_0_uses_the_boolean_call_form(self):
        torch = fake_torch("2.0.1+cu118")
        cap, said = self.start(torch, max_entries=5000)
        self.assertTrue(cap.recording)
        self.assertEqual(
            self.records(torch),
            [
                (
                    (True,),
                    {
                        "record_context": True,
                        "trace_alloc_max_entries": 5000,
                        "trace_alloc_record_context": True,
                    },
                )
            ],
        )
        self.assertIn("last 5000 events (PyTorch 2.0.1+cu118)", said)
        cap.stop()
        self.assertEqual(self.records(torch)[-1], ((False,), {}))

    def test_2_1_on_uses_the_string_call_form(self):
        for version in ("2.1.2+cu121", "2.4.0a0+git1234abc", "2.15.0"):
            with self.subTest(version=version):
                torch = fake_torch(version)
                cap, _ = self.start(torch, max_entries=777)
                self.assertEqual(
                    self.records(torch),
                    [(("all",), {"context": "all", "stacks": "python", "max_entries": 777})],
                )
                cap.stop()
                self.assertEqual(self.records(torch)[-1], ((None,), {}))

    def test_versions_before_2_0_cannot_record_and_say_so(self):
        torch = fake_torch("1.13.1+cu117")
        cap, said = self.start(torch)
        self.assertFalse(cap.recording)
        self.assertEqual(torch.calls, [])
        self.assertIn("PyTorch 1.13.1+cu117 cannot record an allocation trace", said)
        self.assertIn("from 2.0 on", said)

    def test_without_cuda_nothing_is_called(self):
        torch = fake_torch(cuda=False)
        cap, said = self.start(torch)
        self.assertFalse(cap.recording)
        self.assertEqual(torch.calls, [])
        self.assertIn("CUDA is not available: nothing is recorded.", said)

    def test_without_torch_it_says_so(self):
        err = io.StringIO()
        with mock.patch.dict(sys.modules, {"torch": None}), contextlib.redirect_stderr(err):
            cap = allocdoc.capture(directory=self.dir)
            self.assertFalse(cap.start())
        self.assertIn("PyTorch is not installed", err.getvalue())

    def test_cuda_malloc_async_keeps_no_history(self):
        torch = fake_torch(backend="cudaMallocAsync")
        cap, said = self.start(torch)
        self.assertFalse(cap.recording)
        self.assertEqual(torch.calls, [])
        self.assertIn("cudaMallocAsync allocator backend keeps no history", said)

    def test_a_refusal_by_pytorch_is_reported(self):
        torch = fake_torch(refuse="record_context_cpp is not supported on this platform")
        cap, said = self.start(torch)
        self.assertFalse(cap.recording)
        self.assertIn("refused to record: RuntimeError: record_context_cpp", said)
        self.assertEqual(torch.observers, [])

    def test_the_observer_is_attached_once(self):
        torch = fake_torch()
        first, _ = self.start(torch)
        first.stop()
        second, _ = self.start(torch)
        self.assertEqual(len(torch.observers), 1)
        second.stop()

    def oom(self, torch, device=0, alloc=2 * GIB, allowed=80 * GIB, free=GIB // 2):
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            torch.observers[0](device, alloc, allowed, free)
        return err.getvalue()

    def test_an_oom_writes_the_snapshot_stats_and_the_command(self):
        snapshot = {"segments": [{"address": 1, "total_size": 2 * GIB}], "device_traces": [[]]}
        torch = fake_torch(snapshot=snapshot)
        with mock.patch.dict(os.environ, {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128"}):
            cap, _ = self.start(torch)
        said = self.oom(torch, device=1)
        (incident,) = os.listdir(self.dir)
        self.assertRegex(incident, r"^rank3-\d{8}-\d{6}-pid\d+$")
        path = os.path.join(self.dir, incident)
        with open(os.path.join(path, "snapshot.pickle"), "rb") as f:
            self.assertEqual(pickle.load(f), snapshot)
        with open(os.path.join(path, "memory_stats.json")) as f:
            self.assertEqual(json.load(f)["reserved_bytes.all.current"], 2 * GIB)
        with open(os.path.join(path, "observer.json")) as f:
            (event,) = json.load(f)
        self.assertEqual(
            {k: event[k] for k in ("device", "requested_bytes", "allowed_bytes", "device_free_bytes", "conf")},
            {
                "device": 1,
                "requested_bytes": 2 * GIB,
                "allowed_bytes": 80 * GIB,
                "device_free_bytes": GIB // 2,
                "conf": "max_split_size_mb:128",
            },
        )
        self.assertIn(("memory_stats", (1,), {}), torch.calls)
        command = f"allocdoc recommend {os.path.join(path, 'snapshot.pickle')} --current max_split_size_mb:128"
        self.assertEqual(said.strip().splitlines()[-1].strip(), command)
        self.assertEqual(cap.command(), command)
        cap.stop()

    def test_later_ooms_stop_dumping_after_max_dumps(self):
        torch = fake_torch()
        cap, _ = self.start(torch, max_dumps=2)
        said = [self.oom(torch) for _ in range(4)]
        self.assertEqual(sum(1 for c in torch.calls if c[0] == "_snapshot"), 2)
        with open(os.path.join(cap.incident, "observer.json")) as f:
            events = json.load(f)
        self.assertEqual(len(events), 4)
        first = os.path.join(cap.incident, "snapshot.pickle")
        second = os.path.join(cap.incident, "snapshot-2.pickle")
        self.assertEqual([e["snapshot"] for e in events], [first, second, None, None])
        # The command printed at the first OOM names the first snapshot, which stays.
        self.assertIn(f"allocdoc recommend {first}", said[0])
        self.assertIn(f"wrote {second}; the first snapshot is kept", said[1])
        self.assertIn(f"allocdoc recommend {second}", said[1])
        self.assertEqual(said[2:], ["", ""])
        self.assertTrue(os.path.exists(os.path.join(cap.incident, "memory_stats-2.json")))
        cap.stop()

    def test_each_dump_is_its_own_file(self):
        count = [0]
        torch = fake_torch()

        def snap():
            count[0] += 1
            return {"segments": [], "device_traces": [[]], "dump": count[0]}

        torch.cuda.memory._snapshot = snap
        cap, _ = self.start(torch, max_dumps=3)
        for _ in range(3):
            self.oom(torch)
        for name, n in [("snapshot.pickle", 1), ("snapshot-2.pickle", 2), ("snapshot-3.pickle", 3)]:
            with open(os.path.join(cap.incident, name), "rb") as f:
                self.assertEqual(pickle.load(f)["dump"], n)
        cap.stop()

    def test_the_observer_never_raises(self):
        torch = fake_torch()
        cap, _ = self.start(torch)

        def broken():
            raise MemoryError("host memory is gone too")

        torch.cuda.memory._snapshot = broken
        said = self.oom(torch)
        self.assertIn("could not write the out-of-memory snapshot: MemoryError: host memory is gone too", said)
        cap.stop()

    def test_a_stopped_capture_ignores_later_ooms(self):
        torch = fake_torch()
        cap, _ = self.start(torch)
        cap.stop()
        self.assertEqual(self.oom(torch), "")
        self.assertEqual(os.listdir(self.dir), [])

    def test_the_context_manager_adds_the_oom_text_and_stops(self):
        torch = fake_torch()
        message = "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.11 GiB"
        err = io.StringIO()
        with mock.patch.dict(sys.modules, {"torch": torch}), contextlib.redirect_stderr(err):
            with self.assertRaises(FakeOutOfMemoryError):
                with allocdoc.capture(directory=self.dir) as cap:
                    torch.observers[0](0, 2 * GIB, 80 * GIB, 0)
                    raise FakeOutOfMemoryError(message)
        with open(os.path.join(cap.incident, "oom.txt")) as f:
            self.assertEqual(f.read(), f"torch.OutOfMemoryError: {message}\n")
        self.assertFalse(cap.recording)
        self.assertEqual(self.records(torch)[-1], ((None,), {}))

    def test_other_exceptions_write_no_oom_text(self):
        torch = fake_torch()
        with mock.patch.dict(sys.modules, {"torch": torch}), contextlib.redirect_stderr(io.StringIO()):
            with self.assertRaises(ValueError):
                with allocdoc.capture(directory=self.dir) as cap:
                    torch.observers[0](0, GIB, 80 * GIB, 0)
                    raise ValueError("not memory")
        self.assertFalse(os.path.exists(os.path.join(cap.incident, "oom.txt")))

    def test_install_chains_the_excepthook(self):
        torch = fake_torch()
        seen = []
        previous = lambda *a: seen.append(a[0])  # noqa: E731
        with mock.patch.object(sys, "excepthook", previous), mock.patch.dict(
            sys.modules, {"torch": torch}
        ), contextlib.redirect_stderr(io.StringIO()):
            cap = allocdoc.capture.install(directory=self.dir)
            self.assertIs(allocdoc.capture.install(), cap)
            torch.observers[0](0, GIB, 80 * GIB, 0)
            sys.excepthook(FakeOutOfMemoryError, FakeOutOfMemoryError("CUDA out of memory."), None)
            cap.stop()
        self.assertEqual(seen, [FakeOutOfMemoryError])
        with open(os.path.join(cap.incident, "oom.txt")) as f:
            self.assertEqual(f.read(), "torch.OutOfMemoryError: CUDA out of memory.\n")

    def test_the_printed_command_runs(self):
        """A snapshot whose trace ends in an `oom` entry (allocdoc's own replay of
        the devlog trace under expandable segments on an 80 MiB card) goes through
        the capture; the printed command then recommends from the recorded OOM."""
        exe = shutil.which("allocdoc")
        if exe is None:
            self.skipTest("the allocdoc command is not installed (scripts/python_check.sh installs it)")
        repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        recorded = os.path.join(self.dir, "recorded.pickle")
        trace = os.path.join(repo, "fixtures", "validate", "interleaved_16mib.csv")
        run = subprocess.run(
            [exe, "replay", trace, "--conf", "expandable_segments:True", "--capacity", "80MiB",
             "--emit-snapshot", recorded],
            capture_output=True,
        )
        self.assertEqual(run.returncode, 1, run.stderr)  # the OOM the snapshot records
        with open(recorded, "rb") as f:
            snapshot = pickle.load(f)
        self.assertEqual(snapshot["device_traces"][0][-1]["action"], "oom")
        torch = fake_torch(snapshot=snapshot)
        cap, _ = self.start(torch, directory=os.path.join(self.dir, "out"))
        said = self.oom(torch, alloc=32 << 20)
        command = shlex.split(said.strip().splitlines()[-1]) + ["--format", "json"]
        result = subprocess.run(command, capture_output=True, text=True)
        self.assertEqual(result.returncode, 0, result.stderr)
        out = json.loads(result.stdout)
        # The card is read from the recorded OOM: free then (0) + what was reserved (80 MiB).
        self.assertEqual(out["capacity_bytes"], 80 << 20)
        self.assertIsNone(out["candidates"][0]["oom"])
        cap.stop()


if __name__ == "__main__":
    unittest.main()


class PackageTest(unittest.TestCase):
    def test_dir_lists_the_functions_loaded_on_first_use(self):
        names = dir(allocdoc)
        for name in ("capture", "diagnose", "recommend", "validate", "top", "InputError"):
            self.assertIn(name, names)
