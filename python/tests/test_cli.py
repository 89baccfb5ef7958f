"""The wheel's `allocdoc` command against the cargo build's binary: the same
standard output, standard error and exit code, byte for byte, for every
command. ALLOCDOC_CARGO_BIN names the cargo binary; the wheel's command is the
`allocdoc` on PATH (scripts/python_check.sh sets both up)."""

import os
import shutil
import subprocess
import unittest
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
F = REPO / "fixtures"

CASES = [
    ["diagnose", F / "text" / "readme_example.log"],
    ["diagnose", F / "text" / "readme_example.log", "--format", "json"],
    ["diagnose", F / "text" / "readme_example.log", "--format", "markdown", "-v"],
    ["diagnose", F / "snapshots" / "gen-small-p2.pickle", "--format", "json"],
    ["diagnose", "--torch-version", "2.1", "--conf", "max_split_size_mb:128", F / "eval" / "comfy-org-comfyui-9529.txt"],
    ["diagnose", "--each", "--format", "jsonl", F / "text"],
    ["parse", "--format", "json", F / "text" / "constructed_stats_json.log", F / "text" / "constructed_xpu.log"],
    ["parse", "--each", "--format", "jsonl", F / "eval"],
    ["parse", F / "snapshots" / "maphsge4-select_n_snapshot_dev1.pickle"],
    ["conf", "check", "max_split_size_mb:20", "--torch-version", "2.4"],
    ["conf", "check", "roundup_power2_divisions:[256:1,512:2,>:8]", "--torch-version", "2.10", "--format", "json"],
    ["replay", F / "validate" / "interleaved_16mib.csv", "--conf", "", "--conf", "expandable_segments:True", "--capacity", "80MiB"],
    ["replay", F / "snapshots" / "maphsge4-select_n_snapshot_traced.pickle", "--fidelity", "--format", "json"],
    ["recommend", F / "validate" / "interleaved_16mib.csv", "--capacity", "80MiB", "--format", "json"],
    ["validate", F / "validate" / "oom_fragmented_2.5.txt", "--conf", "expandable_segments:True"],
    ["validate", F / "validate" / "interleaved_16mib.csv", "--conf", "expandable_segments:True", "--device", "cuda"],
    ["rules", "list", "--format", "json"],
    ["rules", "show", "reserved-gap"],
    ["completions", "bash"],
    ["completions", "fish"],
    ["--help"],
    ["diagnose", "--help"],
    ["--version"],
    ["diagnose", F / "no-such-file.log"],
    ["replay", F / "text" / "readme_example.log"],
    ["conf", "check"],
    ["no-such-command"],
]


class CliTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.cargo = os.environ.get("ALLOCDOC_CARGO_BIN")
        cls.wheel = shutil.which("allocdoc")
        if not cls.cargo or cls.wheel is None:
            raise unittest.SkipTest("needs ALLOCDOC_CARGO_BIN and the wheel's allocdoc on PATH")
        if os.path.samefile(cls.cargo, cls.wheel):
            raise unittest.SkipTest("the allocdoc on PATH is the cargo binary, not the wheel's command")

    def run_both(self, args, stdin=None):
        args = [str(a) for a in args]
        runs = []
        for exe in (self.cargo, self.wheel):
            with open(stdin, "rb") if stdin else open(os.devnull, "rb") as inp:
                runs.append(subprocess.run([exe, *args], stdin=inp, capture_output=True, cwd=REPO))
        return runs

    def test_same_output_and_exit_code(self):
        for args in CASES:
            with self.subTest(args=" ".join(map(str, args))):
                cargo, wheel = self.run_both(args)
                self.assertEqual(wheel.returncode, cargo.returncode)
                self.assertEqual(wheel.stdout.decode(), cargo.stdout.decode())
                self.assertEqual(wheel.stderr.decode(), cargo.stderr.decode())
                # Not vacuous: every case prints something.
                self.assertTrue(cargo.stdout or cargo.stderr)

    def test_standard_input(self):
        cargo, wheel = self.run_both(["diagnose", "--format", "json"], stdin=F / "text" / "readme_example.log")
        self.assertEqual(cargo.returncode, 0)
        self.assertIn(b'"input": "standard input"', cargo.stdout)
        self.assertEqual((wheel.returncode, wheel.stdout, wheel.stderr), (cargo.returncode, cargo.stdout, cargo.stderr))


if __name__ == "__main__":
    unittest.main()
