"""A recorder's knobs in one object (issue 68, item 2): `RecordOptions` and `FlushOptions` check
their values, `Recorder(path, run, options)` takes them (and options by name over them) and
reads no environment variable, and `from_environment` (what `create_or_gated` calls) is the one
place a repro command's variables are read, each winning over the program's own choice."""

import os
import shutil
import sys
import tempfile
import unittest
from unittest import mock

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from recorded_program import TRAINING_LOOP  # noqa: E402  (beside this file)

try:
    import torch
except ImportError:  # pragma: no cover
    torch = None


@unittest.skipUnless(torch, "torch is not installed")
class RecordOptionsTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp()

    def tearDown(self):
        shutil.rmtree(self.dir)

    def test_bad_values_are_refused_by_name(self):
        from repro.torch import FlushOptions, RecordOptions
        from repro.writer import WriteError

        for bad, message in (({"capture": "often"}, "capture policy"), ({"modules": "every:0"}, "modules policy"),
                             ({"data_hash": "md5"}, "data_hash='md5'"), ({"stop_after": -1}, "stop_after=-1"),
                             ({"stop_after": True}, "stop_after=True")):
            with self.subTest(bad=bad), self.assertRaisesRegex(WriteError, message):
                RecordOptions(**bad)
        with self.assertRaisesRegex(WriteError, "flush mode 'eager'"):
            FlushOptions(mode="eager")
        with self.assertRaisesRegex(TypeError, "unknown recorder option\\(s\\): captures"):
            RecordOptions().but(captures="all")
        self.assertEqual(RecordOptions(capture="all").but(capture=None, ops="all"), RecordOptions(capture="all", ops="all"))

    def test_a_recorder_made_directly_reads_no_environment_variable(self):
        from repro.torch import RecordOptions, Recorder
        from repro.trace import Trace

        variables = {"REPRO_CAPTURE": "all", "REPRO_DATA_HASH": "xxh3-1k", "REPRO_MODULES": "all",
                     "REPRO_TORCH_FLUSH": "module", "REPRO_STOP_AFTER": "0"}
        path = os.path.join(self.dir, "direct")
        with mock.patch.dict(os.environ, variables):
            recorder = Recorder(path, {"workload": "x", "steps": 2}, RecordOptions(capture="none"), ops="all")
        self.assertEqual(recorder.options, RecordOptions(capture="none", ops="all"))
        self.assertEqual(recorder.flush_policy.mode, "batched")
        for step in range(2):  # not stopped after step 0
            with recorder.step(step) as s:
                s.record("x", torch.ones(3), kind="input")
        recorder.finish()
        with Trace(path) as t:
            self.assertEqual((t.data_hash, [s.step for s in t.steps()]), ("blake3", [0, 1]))

    def test_a_repro_commands_variables_win_over_the_programs_options(self):
        from repro.torch import FlushOptions, RecordOptions, Recorder
        from repro.torch.options import from_environment
        from repro.writer import WriteError

        mine = RecordOptions(capture="none", modules="none", flush=FlushOptions(max_queued=8))
        self.assertEqual(from_environment(mine, {}), mine)
        asked = from_environment(mine, {"REPRO_CAPTURE": "all", "REPRO_MODULES": "every:2", "REPRO_OPS": "steps:1",
                                        "REPRO_DATA_HASH": "xxh3-1k", "REPRO_STOP_AFTER": "3", "REPRO_REPLACE": "1",
                                        "REPRO_TORCH_FLUSH": "module"})
        self.assertEqual(asked, RecordOptions(capture="all", modules="every:2", ops="steps:1", data_hash="xxh3-1k",
                                              stop_after=3, replace=True, flush=FlushOptions(mode="module", max_queued=8)))
        for variable, value, message in (("REPRO_CAPTURE", "often", "REPRO_CAPTURE=often: expected a step policy"),
                                         ("REPRO_OPS", "x", "REPRO_OPS=x: expected a step policy"),
                                         ("REPRO_STOP_AFTER", "-1", "REPRO_STOP_AFTER=-1: expected a step number"),
                                         ("REPRO_REPLACE", "yes", "REPRO_REPLACE=yes: expected 1 or 0"),
                                         ("REPRO_TORCH_FLUSH", "eager", "REPRO_TORCH_FLUSH=eager: expected one of")):
            with self.subTest(variable=variable), self.assertRaisesRegex(WriteError, message):
                from_environment(mine, {variable: value})
        # create_or_gated reads them: the program's capture loses to REPRO_CAPTURE.
        path = os.path.join(self.dir, "gated")
        with mock.patch.dict(os.environ, {"REPRO_CAPTURE": "all", "REPRO_TRACE_DIR": ""}):
            recorder = Recorder.create_or_gated(path, {"workload": "x", "steps": 1}, options=mine, ops="all")
        self.assertEqual((recorder.options.capture, recorder.options.ops, recorder.options.flush.max_queued),
                         ("all", "all", 8))
        recorder.finish()

    def test_capture_names_keep_the_values_of_those_tensors_alone(self):
        import subprocess

        from repro.torch import ModelRecorder, Recorder
        from repro.trace import Trace

        def record(path, **options):
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(4, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            rec = ModelRecorder(Recorder(path, {"workload": "names", "steps": 3}, **options), model)
            exec(TRAINING_LOOP.format(steps=3, each_step=""), {"torch": torch, "model": model, "opt": opt, "rec": rec})

        named, every = os.path.join(self.dir, "named"), os.path.join(self.dir, "every")
        record(named, capture="steps:1", modules="all", capture_names=("0.weight.grad", "1"))
        record(every, capture="steps:1", modules="all")
        with Trace(named) as t, Trace(every) as full:
            steps, full_steps = list(t.steps()), list(full.steps())
            kept = {x.name for x in steps[1].tensors if x.in_payload}
            self.assertEqual(kept, {"0.weight.grad", "1"})
            self.assertIn("0.weight", {x.name for x in full_steps[1].tensors if x.in_payload})
            # The same hashes as a step that keeps every value: only what is stored differs.
            self.assertEqual([x.hash for x in steps[1].tensors], [x.hash for x in full_steps[1].tensors])
            grad = next(x for x in steps[1].tensors if x.name == "0.weight.grad")
            full_grad = next(x for x in full_steps[1].tensors if x.name == "0.weight.grad")
            self.assertEqual(t.values(steps[1], grad), full.values(full_steps[1], full_grad))
            weight = next(x for x in steps[1].tensors if x.name == "0.weight")
            self.assertIsNone(t.values(steps[1], weight))
        run = subprocess.run([os.environ.get("REPRO_BIN", "target/release/repro"), "diff", named, every],
                             capture_output=True, text=True)
        self.assertEqual(run.returncode, 0, run.stdout + run.stderr)
        self.assertIn("IDENTICAL", run.stdout)
        with mock.patch.dict(os.environ, {"REPRO_CAPTURE_NAMES": "loss,1", "REPRO_TRACE_DIR": ""}):
            asked = Recorder.create_or_gated(os.path.join(self.dir, "asked"), {"workload": "x"})
        self.assertEqual(asked.options.capture_names, ("loss", "1"))
        asked.finish()

    def test_a_third_positional_argument_that_is_not_options_is_refused(self):
        from repro.torch import Recorder

        with self.assertRaisesRegex(TypeError, "third argument is a RecordOptions, not str"):
            Recorder(os.path.join(self.dir, "t"), {"workload": "x"}, "all")
        self.assertFalse(os.path.exists(os.path.join(self.dir, "t")))


if __name__ == "__main__":
    unittest.main()
