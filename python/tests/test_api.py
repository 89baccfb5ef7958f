"""The Python API against the cargo binary: every function returns the dict the
command's `--format json` prints, for a path, bytes and str, and raises the
error kind's exception with the command's message. ALLOCDOC_CARGO_BIN names the
cargo binary."""

import faulthandler
import json
import logging
import os
import subprocess
import tempfile
import threading
import unittest
from pathlib import Path

import allocdoc

REPO = Path(__file__).resolve().parents[2]
F = REPO / "fixtures"

TEXTS = [
    F / "text" / "readme_example.log",
    F / "text" / "constructed_summary_series.log",
    F / "text" / "constructed_nccl_failure_2.log",
    F / "eval" / "comfy-org-comfyui-9529.txt",
    F / "validate" / "oom_fragmented_2.5.txt",
]
SNAPSHOTS = [F / "snapshots" / "gen-small-p4.pickle", F / "snapshots" / "maphsge4-select_n_snapshot_traced.pickle"]


def cli(*args, stdin=None):
    """(exit code, JSON or None, standard error) of the cargo binary."""
    exe = os.environ["ALLOCDOC_CARGO_BIN"]
    with open(stdin, "rb") if stdin else open(os.devnull, "rb") as inp:
        r = subprocess.run([exe, *map(str, args)], stdin=inp, capture_output=True, text=True)
    return r.returncode, (json.loads(r.stdout) if r.stdout.strip() else None), r.stderr


def renamed(value, old, new):
    """`value` with every "input" field equal to `old` set to `new`."""
    if isinstance(value, dict):
        return {k: (new if k == "input" and v == old else renamed(v, old, new)) for k, v in value.items()}
    if isinstance(value, list):
        return [renamed(v, old, new) for v in value]
    return value


@unittest.skipUnless(os.environ.get("ALLOCDOC_CARGO_BIN"), "needs ALLOCDOC_CARGO_BIN (the cargo build's binary)")
class ApiTest(unittest.TestCase):
    def test_parse_and_diagnose_equal_the_command(self):
        for path in TEXTS + SNAPSHOTS:
            with self.subTest(path=path.name):
                for name in ("parse", "diagnose"):
                    code, want, _ = cli(name, path, "--format", "json")
                    self.assertEqual(code, 0)
                    self.assertEqual(getattr(allocdoc, name)(path), want)
                    self.assertEqual(getattr(allocdoc, name)(str(path)), want)
                    # The content itself: as the command reading standard input.
                    _, from_stdin, _ = cli(name, "--format", "json", stdin=path)
                    data = path.read_bytes()
                    self.assertEqual(
                        getattr(allocdoc, name)(data), renamed(from_stdin, "standard input", "<bytes>")
                    )
                    if path.suffix != ".pickle":
                        text = data.decode("utf-8", "replace")
                        if "\n" in text:
                            self.assertEqual(
                                getattr(allocdoc, name)(text),
                                renamed(from_stdin, "standard input", "<string>"),
                            )

    def test_a_snapshot_given_as_bytes_gets_its_trace_rules_replayed(self):
        # The trace rules' settings are checked by replaying the snapshot's
        # trace: from bytes as from the file (standard input cannot be re-read).
        path = F / "snapshots" / "gen-trace-fraction-cap.pickle"
        _, want, _ = cli("diagnose", path, "--format", "json")
        self.assertTrue(any("replay_check" in f for f in want["findings"]), want["findings"])
        self.assertEqual(allocdoc.diagnose(path.read_bytes()), renamed(want, str(path), "<bytes>"))

    def test_several_inputs_are_one_incident(self):
        paths = [F / "text" / "constructed_stats_json.log", F / "text" / "readme_example.log"]
        _, want, _ = cli("diagnose", *paths, "--format", "json")
        self.assertEqual(allocdoc.diagnose(paths), want)

    def test_several_contents_are_numbered(self):
        a, b = (F / "text" / "constructed_stats_json.log").read_bytes(), TEXTS[0].read_text()
        got = allocdoc.parse([a, TEXTS[1], b])
        names = [o["input"] for o in got["observations"]]
        self.assertEqual(sorted(set(names)), sorted({"<bytes 1>", str(TEXTS[1]), "<string 3>"}))
        self.assertEqual(names, sorted(names, key=["<bytes 1>", str(TEXTS[1]), "<string 3>"].index))

    def test_diagnose_options(self):
        path = F / "eval" / "comfy-org-comfyui-9529.txt"
        _, want, _ = cli("diagnose", path, "--torch-version", "2.0", "--platform", "windows", "--format", "json")
        got = allocdoc.diagnose(path, torch_version="2.0", platform="windows")
        self.assertEqual(got, want)
        self.assertNotEqual(got, allocdoc.diagnose(path), "the options change the answer")

    def test_replay_recommend_validate_equal_the_command(self):
        csv = F / "validate" / "interleaved_16mib.csv"
        code, want, _ = cli("replay", csv, "--conf", "", "--conf", "expandable_segments:True", "--capacity", "80MiB", "--format", "json")
        self.assertEqual(code, 1)  # the last config runs out of memory: a result, not an error
        self.assertEqual(allocdoc.replay(csv, ["", "expandable_segments:True"], "80MiB"), want)
        self.assertEqual(allocdoc.replay(csv, ["", "expandable_segments:True"], 80 << 20), want)
        snap = F / "snapshots" / "maphsge4-select_n_snapshot_traced.pickle"
        _, want, _ = cli("replay", snap, "--fidelity", "--format", "json")
        got = allocdoc.replay(snap.read_bytes(), fidelity=True)
        self.assertEqual(got["fidelity"], want["fidelity"])
        self.assertEqual(got["fidelity"]["address_matches"], got["fidelity"]["alloc_events"])
        _, want, _ = cli("recommend", csv, "--capacity", "80MiB", "--format", "json")
        self.assertEqual(allocdoc.recommend(csv, capacity="80MiB"), want)
        text = F / "validate" / "oom_fragmented_2.5.txt"
        code, want, _ = cli("validate", text, "--conf", "expandable_segments:True", "--format", "json")
        self.assertEqual(code, 4)  # text only: the verdict is uncertain, a result, not an error
        self.assertEqual(want["strength"], "uncertain")
        self.assertEqual(allocdoc.validate(text, "expandable_segments:True"), want)

    def test_top_and_diff_equal_the_command(self):
        magma = F / "snapshots" / "magma27-assignment2-systems_memory_snapshot.pickle"
        wedson = F / "snapshots" / "wedsonlin-assignment2-systems_medium_128_inference_memory_snapshot.pickle"
        code, want, _ = cli("top", magma, "--format", "json")
        self.assertEqual(code, 0)
        self.assertEqual(allocdoc.top(magma), want)
        peak = want["devices"][0]["moments"][0]
        self.assertEqual((peak["moment"], peak["event_index"], peak["allocated_bytes"]), ("peak", 1402, 13923997700))
        _, want, _ = cli("top", magma, "--at", "peak", "--by", "category", "-n", "3", "--format", "json")
        self.assertEqual(allocdoc.top(magma, at="peak", by="category", n=3), want)
        _, from_stdin, _ = cli("top", "-", "--format", "json", stdin=magma)
        self.assertEqual(allocdoc.top(magma.read_bytes()), renamed(from_stdin, "standard input", "<bytes>"))
        _, want, _ = cli("diff", wedson, magma, "--by", "category", "--format", "json")
        self.assertEqual(allocdoc.diff(wedson, magma, by="category"), want)
        with self.assertRaises(allocdoc.UsageError):
            allocdoc.top(magma, by="colour")
        with self.assertRaises(allocdoc.InputError):
            allocdoc.top(TEXTS[0])

    def test_fit_equals_the_command(self):
        a, b = F / "fit" / "attn-256.pickle.xz", F / "fit" / "attn-1024.pickle.xz"
        code, want, _ = cli("fit", a, b, "--sizes", "256,1024", "--at", "4096", "--capacity", "12GiB",
                            "--conf", "expandable_segments:True", "--knob", "seq_len", "--format", "json")
        self.assertEqual(code, 0)
        got = allocdoc.fit([a, b], sizes=[256, 1024], at=[4096], capacity="12GiB",
                           confs=["expandable_segments:True"], knob="seq_len")
        self.assertEqual(got, want)
        self.assertEqual(want["predictions"][0]["size"], 4096)
        with self.assertRaises(allocdoc.UsageError) as e:
            allocdoc.fit([a, b], sizes=[0, 1024])
        self.assertIn("sizes 0: sizes start at 1", str(e.exception))
        self.assertNotIn("--", str(e.exception))
        with self.assertRaises(allocdoc.InputError):
            allocdoc.fit([a, TEXTS[0]], sizes=[256, 1024])

    def test_fit_in_two_knobs_equals_the_command(self):
        files = [F / "grid" / f"attn-{p}.pickle.xz" for p in ("d16_s256", "d32_s256", "d16_s1024")]
        code, want, _ = cli("fit", *files, "--points", "16,256;32,256;16,1024", "--knobs", "d_model,seq_len",
                            "--at-points", "64,4096", "--capacity", "16GiB", "--along", "d_model=16,64",
                            "--format", "json")
        self.assertEqual(code, 0)
        got = allocdoc.fit(files, points=[(16, 256), (32, 256), (16, 1024)], knobs=("d_model", "seq_len"),
                           at_points=[(64, 4096)], capacity="16GiB", along=("d_model", [16, 64]))
        self.assertEqual(got, want)
        self.assertEqual(want["predictions"][0]["point"], [64, 4096])
        # The defaults only, at each value of the fixed knob: d_model 16 and 64.
        self.assertEqual([(f["conf"], f["value"]) for f in want["frontier"]], [("", 16), ("", 64)])

    def test_forecast_in_two_knobs_equals_the_command(self):
        files = [F / "grid" / f"attn-{p}.pickle.xz" for p in ("d16_s256", "d32_s256", "d16_s1024")]
        lengths = F / "forecast" / "lengths.txt"
        code, want, _ = cli("forecast", *files, "--points", "16,256;32,256;16,1024", "--knobs", "d_model,seq_len",
                            "--lengths", lengths, "--batch", "max", "--steps", "20", "--pad-to", "64",
                            "--capacity", "1GiB", "--format", "json")
        self.assertIn(code, (0, 4))
        got = allocdoc.forecast(files, points=[(16, 256), (32, 256), (16, 1024)], knobs=("d_model", "seq_len"),
                                lengths=lengths, batch="max", steps=20, pad_to=64, capacity="1GiB")
        self.assertEqual(got, want)
        self.assertEqual(want["batch"], max(c["batch"]["largest"] for c in want["configs"]))

    def test_forecast_equals_the_command(self):
        a, b = F / "forecast" / "xl-forward-128.pickle.xz", F / "forecast" / "xl-forward-256.pickle.xz"
        run = F / "forecast" / "xl-forward-ramp.txt"
        code, want, _ = cli("forecast", a, b, "--sizes", "128,256", "--run", run, "--capacity", "31579502018",
                            "--knob", "context_length", "--format", "json")
        self.assertEqual(code, 0)
        got = allocdoc.forecast([a, b], sizes=[128, 256], run=run, capacity=31579502018, knob="context_length")
        self.assertEqual(got, want)
        # The run as a list of sizes answers the same.
        steps = [int(l) for l in run.read_text().splitlines() if l and not l.startswith("#")]
        self.assertEqual(allocdoc.forecast([a, b], sizes=[128, 256], run=steps, capacity=31579502018,
                                           knob="context_length"), want)
        defaults = want["configs"][0]
        self.assertEqual(defaults["oom"]["step"], 11)
        self.assertEqual(want["recommended"], "expandable_segments:True")
        with self.assertRaises(allocdoc.InputError) as e:
            allocdoc.forecast([a, b], sizes=[128, 256], run=[512, 0])
        self.assertIn("<run>:2", str(e.exception))

    def test_recommend_and_validate_take_the_setup(self):
        text = F / "validate" / "oom_fragmented_2.5.txt"
        _, want, _ = cli("recommend", text, "--torch-version", "2.0", "--platform", "windows", "--format", "json")
        got = allocdoc.recommend(text, torch_version="2.0", platform="windows")
        self.assertEqual(got, want)
        self.assertEqual(got["answer"]["setup"]["platform"]["certainty"], "given")
        self.assertEqual(got["answer"]["setup"]["torch"]["value"], "2.0")
        conf = "max_split_size_mb:512"
        _, want, _ = cli("validate", text, "--conf", conf, "--platform", "windows", "--format", "json")
        self.assertEqual(allocdoc.validate(text, conf, platform="windows"), want)
        with self.assertRaises(allocdoc.UsageError):
            allocdoc.recommend(text, platform="solaris")

    def test_errors_raise_the_kind_with_the_message(self):
        cases = [
            (allocdoc.InputError, lambda: allocdoc.diagnose(F / "no-such-file.log"), ["diagnose", F / "no-such-file.log"]),
            (allocdoc.InputError, lambda: allocdoc.replay(F / "text" / "readme_example.log"), ["replay", F / "text" / "readme_example.log"]),
            (allocdoc.UsageError, lambda: allocdoc.diagnose(TEXTS[0], torch_version="two"), ["diagnose", TEXTS[0], "--torch-version", "two"]),
            (allocdoc.NoDeviceError, lambda: allocdoc.validate(F / "validate" / "interleaved_16mib.csv", "", device="cuda"), ["validate", F / "validate" / "interleaved_16mib.csv", "--conf", "", "--device", "cuda"]),
        ]
        for kind, call, args in cases:
            with self.subTest(args=args):
                code, _, stderr = cli(*args)
                with self.assertRaises(kind) as caught:
                    call()
                self.assertIsInstance(caught.exception, allocdoc.Error)
                # The command's message, its flags named as the keyword arguments.
                self.assertEqual(f"allocdoc: error: {caught.exception}\n", stderr.replace("--torch-version", "torch_version"))
                self.assertEqual(code, {allocdoc.NoDeviceError: 3}.get(kind, 2))

    def test_capacities_the_command_refuses_are_usage_errors(self):
        csv = F / "validate" / "interleaved_16mib.csv"
        for value, reason in [
            (0, "a device of 0 bytes holds nothing"),
            ("0", "a device of 0 bytes holds nothing"),
            ("2PiB", "is over 1 PiB"),
            (-1, "expected a number with an optional unit"),
            (1 << 51, "is over 1 PiB"),
        ]:
            with self.subTest(capacity=value):
                code, _, stderr = cli("recommend", csv, f"--capacity={value}", "--format", "json")
                self.assertEqual(code, 2)
                self.assertIn(reason, stderr)
                for call in (
                    lambda: allocdoc.recommend(csv, capacity=value),
                    lambda: allocdoc.replay(csv, [""], value),
                    lambda: allocdoc.validate(csv, "", capacity=value),
                ):
                    with self.assertRaises(allocdoc.UsageError) as caught:
                        call()
                    self.assertIn(f"invalid size '{value}': ", str(caught.exception))
                    self.assertIn(reason, str(caught.exception))
        with self.assertRaises(allocdoc.UsageError):
            allocdoc.recommend(csv, capacity=80.5)
        with self.assertRaises(allocdoc.UsageError):
            allocdoc.recommend(csv, capacity=True)

    def test_a_missing_path_given_as_str_is_an_input_error(self):
        for path in ["/nonexistent/file.log", "logs/run-7.log", "run-7.pickle", "C:\\logs\\run.log"]:
            with self.subTest(path=path):
                code, _, stderr = cli("diagnose", path, "--format", "json")
                self.assertEqual(code, 2)
                with self.assertRaises(allocdoc.InputError) as caught:
                    allocdoc.diagnose(path)
                self.assertEqual(f"allocdoc: error: {caught.exception}\n", stderr)
        # One line of evidence is still text, and bytes are always text.
        line = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 5.83 GiB of which 6.56 MiB is free."
        self.assertEqual(allocdoc.parse(line)["observations"][0]["kind"], "oom")
        self.assertEqual(allocdoc.parse(b"/nonexistent/file.log")["observations"], [])

    def test_notes_go_to_the_logger(self):
        with self.assertLogs("allocdoc", level=logging.INFO) as logs:
            allocdoc.parse(F / "validate" / "interleaved_16mib.csv")
        self.assertIn("holds no observations", "\n".join(logs.output))

    def test_the_gil_is_released_while_reading(self):
        """diagnose() reads a FIFO; this thread can write it only if the call
        released the GIL."""
        # A held GIL would hang this thread too: the watchdog ends the run then.
        faulthandler.dump_traceback_later(120, exit=True)
        self.addCleanup(faulthandler.cancel_dump_traceback_later)
        with tempfile.TemporaryDirectory() as d:
            fifo = os.path.join(d, "pipe.log")
            os.mkfifo(fifo)
            result = []
            t = threading.Thread(target=lambda: result.append(allocdoc.diagnose(Path(fifo))), daemon=True)
            t.start()
            with open(fifo, "wb") as f:
                f.write(TEXTS[0].read_bytes())
            t.join(60)
            self.assertFalse(t.is_alive(), "diagnose held the GIL while blocked on its input")
        self.assertEqual(result[0]["cause"], "fragmentation")

    def test_sources_of_other_types_are_refused(self):
        with self.assertRaises(TypeError):
            allocdoc.parse(42)


if __name__ == "__main__":
    unittest.main()
