"""The fleet example (python/examples/fleet_dask.py) on a local Dask cluster over
1 100 generated logs: every per-file result equals the line `allocdoc diagnose
--each --format jsonl` prints for that file, in the same order."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "python" / "examples"))

try:
    from distributed import Client, LocalCluster

    import fleet_dask
except ImportError as e:  # dask is an optional extra
    fleet_dask = None
    MISSING = str(e)

LOGS = 1100


@unittest.skipIf(fleet_dask is None, "dask[distributed] is not installed")
class FleetTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.exe = shutil.which("allocdoc")
        if cls.exe is None:
            raise unittest.SkipTest("the allocdoc command is not installed (scripts/python_check.sh installs it)")
        cls.dir = tempfile.mkdtemp(prefix="allocdoc-fleet-")
        cls.root = os.path.join(cls.dir, "logs")
        subprocess.run(
            [sys.executable, str(REPO / "scripts" / "gen_small_logs.py"), cls.root, str(LOGS)],
            check=True, capture_output=True,
        )
        # One input that fails: a pickle cut after its first bytes.
        with open(os.path.join(cls.root, "shard-05", "job-00500.log"), "wb") as f:
            f.write(b"\x80\x04\x95\x10\x00\x00\x00\x00\x00\x00\x00}")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, True)

    def test_every_result_equals_the_jsonl_line(self):
        cli = subprocess.run(
            [self.exe, "diagnose", "--each", "--format", "jsonl", self.root],
            capture_output=True, text=True,
        )
        # Exit 2: one input could not be read; every other line is there.
        self.assertEqual(cli.returncode, 2, cli.stderr)
        expected = [json.loads(line) for line in cli.stdout.splitlines()]
        paths = fleet_dask.log_files(self.root)
        self.assertEqual(len(paths), LOGS)
        self.assertEqual([e["input"] for e in expected], paths)
        with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0") as cluster, Client(
            cluster
        ) as client:
            got = fleet_dask.diagnose_all(paths, client)
        self.assertEqual(len(got), LOGS)
        for want, have in zip(expected, got):
            self.assertEqual(have, want, want["input"])
        errors = [g for g in got if "error" in g]
        self.assertEqual([e["input"] for e in errors], [os.path.join(self.root, "shard-05", "job-00500.log")])
        self.assertEqual(errors[0]["error"]["kind"], "input")
        causes = {g["cause"] for g in got if "cause" in g}
        # The generated logs cover the main causes, so equality is not vacuous.
        self.assertTrue({"fragmentation", "capacity", "request_exceeds_capacity", "unknown"} <= causes, causes)


if __name__ == "__main__":
    unittest.main()
