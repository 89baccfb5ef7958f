"""allocdoc.capture.record_sizes against the stand-in torch of test_capture:
a warm-up step, then one recorded step per size, a snapshot each, and the
`allocdoc fit` command naming them."""

import contextlib
import io
import os
import pickle
import shutil
import sys
import tempfile
import unittest
from unittest import mock

import allocdoc
from test_capture import fake_torch

SNAPSHOT = {"segments": [], "device_traces": [[{"action": "alloc", "addr": 1, "size": 8, "stream": 0}]]}


class RecordSizesTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="allocdoc-sizes-")
        self.addCleanup(shutil.rmtree, self.dir, True)

    def run_sizes(self, torch, **kwargs):
        err = io.StringIO()
        steps = []
        with mock.patch.dict(sys.modules, {"torch": torch}), contextlib.redirect_stderr(err):
            paths = allocdoc.capture.record_sizes(
                lambda n: steps.append((n, len(torch.calls))), directory=self.dir, **kwargs
            )
        return paths, steps, err.getvalue()

    def test_each_size_is_warmed_up_then_recorded_and_the_fit_command_printed(self):
        torch = fake_torch(snapshot=SNAPSHOT)
        torch.cuda.synchronize = lambda: torch.calls.append(("synchronize", (), {}))
        paths, steps, said = self.run_sizes(torch, sizes=[2, 4], knob="batch")
        self.assertEqual([n for n, _ in steps], [2, 2, 4, 4])
        names = [c[0] for c in torch.calls]
        # Recording starts after the warm-up step and stops after the snapshot.
        for (_, warm), (_, recorded) in zip(steps[::2], steps[1::2]):
            self.assertEqual(names[warm:recorded], ["synchronize", "_record_memory_history"])
        self.assertEqual(names.count("_snapshot"), 2)
        on = [c for c in torch.calls if c[0] == "_record_memory_history" and c[1] != (None,)]
        self.assertEqual(on[0][1], ("all",))  # 2.1+ call form
        self.assertEqual(paths, [os.path.join(self.dir, "batch2.pickle"), os.path.join(self.dir, "batch4.pickle")])
        for p in paths:
            with open(p, "rb") as f:
                self.assertEqual(pickle.load(f), SNAPSHOT)
        self.assertIn(f"allocdoc fit {paths[0]} {paths[1]} --sizes 2,4 --knob batch", said)

    def test_a_grid_of_points_records_each_point_and_prints_the_two_knob_command(self):
        torch = fake_torch(snapshot=SNAPSHOT)
        torch.cuda.synchronize = lambda: None
        err = io.StringIO()
        calls = []
        with mock.patch.dict(sys.modules, {"torch": torch}), contextlib.redirect_stderr(err):
            paths = allocdoc.capture.record_sizes(
                lambda a, b: calls.append((a, b)), points=[(1, 512), (2, 512), (1, 1024)],
                knobs=("batch", "seq_len"), directory=self.dir)
        self.assertEqual(calls, [(1, 512), (1, 512), (2, 512), (2, 512), (1, 1024), (1, 1024)])
        self.assertEqual([os.path.basename(p) for p in paths],
                         ["batch1_seq_len512.pickle", "batch2_seq_len512.pickle", "batch1_seq_len1024.pickle"])
        self.assertIn("--points '1,512;2,512;1,1024' --knobs batch,seq_len", err.getvalue())
        for points in ([(1, 2), (2, 2)], [(1, 2), (1, 2), (2, 2)], [(0, 1), (1, 1), (1, 2)]):
            with self.assertRaises(ValueError):
                allocdoc.capture.record_sizes(lambda a, b: None, points=points, directory=self.dir)

    def test_sizes_must_be_two_different_whole_numbers(self):
        for sizes in ([1], [2, 2], [0, 1]):
            with self.assertRaises(ValueError):
                allocdoc.capture.record_sizes(lambda n: None, sizes=sizes, directory=self.dir)

    def test_without_cuda_nothing_is_recorded(self):
        torch = fake_torch(cuda=False)
        paths, steps, said = self.run_sizes(torch, sizes=[1, 2])
        self.assertEqual((paths, steps), ([], []))
        self.assertIn("nothing is recorded", said)


if __name__ == "__main__":
    unittest.main()
