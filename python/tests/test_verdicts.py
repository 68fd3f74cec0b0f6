"""The diff's causes for PyTorch runs say what the trace establishes and no more: a module whose
output differs after identical module outputs may have been fed by code between the recorded
modules (dropout inside a module's own forward), not computed differently. Skipped where torch
is not installed."""

import os
import subprocess
import sys
import tempfile
import unittest

try:
    import torch  # noqa: F401
except ImportError:  # pragma: no cover
    torch = None

REPRO = os.environ.get("REPRO_BIN", "target/release/repro")
PYTHON = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from recorded_program import TRAINING_LOOP  # noqa: E402  (beside this file)

# A block whose forward calls F.dropout between its two Linear layers: the dropout is no module,
# so its mask is drawn where no hook sees it. The masks come from DROPOUT_SEED.
DROPOUT_IN_FORWARD = """\
import os
import sys

import torch
import torch.nn.functional as F

from repro.torch import ModelRecorder


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(4, 16)
        self.fc2 = torch.nn.Linear(16, 1)

    def forward(self, x):
        return self.fc2(F.dropout(torch.tanh(self.fc1(x)), 0.3, self.training))


torch.manual_seed(int(os.environ.get("INIT_SEED", "0")))
model = Block()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
rec = ModelRecorder.create_or_gated(sys.argv[1], {"workload": "dropout-in-forward", "steps": 2}, model,
                                    capture="all")
torch.manual_seed(int(os.environ["DROPOUT_SEED"]))
""" + TRAINING_LOOP.format(steps=2, each_step="")


# A model whose middle module adds, from step 2 on, a draw no seed fixes (a generator seeded from
# os.urandom): the one source of nondeterminism, for `repro bisect` to find down to its aten op.
UNSEEDED_DRAW = """\
import os
import sys

import torch

from repro.torch import ModelRecorder


class Noisy(torch.nn.Module):
    step = 0

    def forward(self, x):
        if Noisy.step < 2:
            return x
        seed = int.from_bytes(os.urandom(4), "little")
        return x + 1e-3 * torch.rand(x.shape, generator=torch.Generator().manual_seed(seed))


torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), Noisy(), torch.nn.Tanh(), torch.nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
rec = ModelRecorder.create_or_gated(sys.argv[1], {"workload": "noisy", "steps": 4}, model)
""" + TRAINING_LOOP.format(steps=4, each_step="    Noisy.step = step\n")


def program_command(tmp: str, text: str) -> tuple:
    """The command that runs the program `text` (written into `tmp`) under a repro command, whose
    REPRO_TRACE_DIR wins over the path it is given; the environment it needs."""
    program = os.path.join(tmp, "train.py")
    with open(program, "w") as f:
        f.write(text)
    return [sys.executable, program, os.path.join(tmp, "unused")], dict(os.environ, PYTHONPATH=PYTHON)


@unittest.skipUnless(torch is not None, "torch is not installed")
class BisectToTheOpTest(unittest.TestCase):
    def test_bisect_reruns_the_diverging_step_down_to_the_aten_op_and_names_a_random_draw(self):
        # Issue 67, item 2: two runs at the default levels, the first diverging step found, both
        # recorded again with every module's and op's output there, the op named.
        with tempfile.TemporaryDirectory() as tmp:
            command, env = program_command(tmp, UNSEEDED_DRAW)
            keep = os.path.join(tmp, "kept")
            run = subprocess.run([REPRO, "bisect", "--keep", keep, "--", *command], capture_output=True, text=True,
                                 env=env)
            self.assertEqual(run.returncode, 1, run.stdout + run.stderr)
            self.assertIn("the runs first differ at step 2", run.stdout + run.stderr)
            self.assertIn("DIVERGED  first at step 2, tensor `1/aten.rand#0`", run.stdout)
            self.assertIn("`aten.rand`, draws random numbers", run.stdout)
            self.assertIn("F32 [8, 8]:", run.stdout)  # the values of the op that differs, compared
            # Issue 67, item 3: what each pair showed, and which one the report is of: a PyTorch
            # program's step goes down to the op as hashes, then the values of what differs.
            self.assertIn("pair 1 (hashes only): first differs at step 2\n", run.stdout)
            self.assertIn("pair 2 (every op's hash at step 2): first differs at step 2\n", run.stdout)
            self.assertIn("pair 3 (values of `1/aten.rand#0` at step 2): first differs at step 2 (reported below)",
                          run.stdout)
            # The pairs recorded again stopped after the step they were asked for
            # (REPRO_STOP_AFTER). (What a capture step keeps of the named tensors alone:
            # test_options.py.)
            sys.path.insert(0, PYTHON)
            from repro.trace import Trace

            for pair in ("ops-1-a", "values-1-a"):
                with Trace(os.path.join(keep, pair)) as trace:
                    self.assertEqual([s.step for s in trace.steps()], [0, 1, 2])


@unittest.skipUnless(torch is not None, "torch is not installed")
class GateEscalationTest(unittest.TestCase):
    def test_a_failed_gate_records_the_diverging_step_again_down_to_the_op_unless_told_not_to(self):
        # Issue 67, item 2: `repro gate -- CMD` on a FAIL escalates as bisect does.
        with tempfile.TemporaryDirectory() as tmp:
            command, env = program_command(tmp, UNSEEDED_DRAW)
            run = subprocess.run([REPRO, "gate", "--", *command], capture_output=True, text=True, env=env)
            self.assertEqual(run.returncode, 1, run.stdout + run.stderr)
            self.assertIn("step 2 recorded again in both runs with every module's and op's output", run.stdout)
            self.assertIn("DIVERGED  first at step 2, tensor `1/aten.rand#0`", run.stdout)
            plain = subprocess.run([REPRO, "gate", "--no-escalate", "--json", "--", *command], capture_output=True,
                                   text=True, env=env)
            self.assertEqual(plain.returncode, 1, plain.stdout + plain.stderr)
            self.assertNotIn('"escalation"', plain.stdout)


@unittest.skipUnless(torch is not None, "torch is not installed")
class StopAfterTest(unittest.TestCase):
    def test_a_program_asked_to_stop_after_a_step_finishes_its_trace_there_and_exits_cleanly(self):
        # `repro bisect` records a pair again only up to the step where they first differ.
        sys.path.insert(0, PYTHON)
        from repro.trace import Trace

        program = UNSEEDED_DRAW + 'print("the loop ran to its end")\n'
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "train.py")
            with open(path, "w") as f:
                f.write(program)
            out = os.path.join(tmp, "run")
            env = dict(os.environ, PYTHONPATH=PYTHON, REPRO_STOP_AFTER="1")
            done = subprocess.run([sys.executable, path, out], capture_output=True, text=True, env=env)
            self.assertEqual(done.returncode, 0, done.stderr[-3000:])
            self.assertNotIn("the loop ran to its end", done.stdout)
            with Trace(out) as trace:
                self.assertEqual([s.step for s in trace.steps()], [0, 1])
                self.assertFalse(trace.complete)
                self.assertIn("after step 1, as asked (REPRO_STOP_AFTER=1)", trace.incomplete_reason)
            for bad in ("x", "-1"):
                env["REPRO_STOP_AFTER"] = bad
                done = subprocess.run([sys.executable, path, os.path.join(tmp, f"bad{bad}")], capture_output=True,
                                      text=True, env=env)
                self.assertNotEqual(done.returncode, 0)
                self.assertIn(f"REPRO_STOP_AFTER={bad}: expected a step number", done.stderr)


@unittest.skipUnless(torch is not None, "torch is not installed")
class ModuleOutputCauseTest(unittest.TestCase):
    def diff_of_runs(self, *seeds: dict) -> subprocess.CompletedProcess:
        """`repro diff` of `DROPOUT_IN_FORWARD` run once with each of `seeds` (its variables)."""
        with tempfile.TemporaryDirectory() as tmp:
            program = os.path.join(tmp, "train.py")
            with open(program, "w") as f:
                f.write(DROPOUT_IN_FORWARD)
            runs = []
            for i, seed in enumerate(seeds):
                out = os.path.join(tmp, f"run-{i}")
                env = dict(os.environ, PYTHONPATH=PYTHON, **seed)
                done = subprocess.run([sys.executable, program, out], capture_output=True, text=True, env=env)
                self.assertEqual(done.returncode, 0, done.stderr[-3000:])
                runs.append(out)
            return subprocess.run([REPRO, "diff", *runs], capture_output=True, text=True)

    def test_an_unseeded_initialisation_is_named_with_pytorch_s_seed_not_candle_s(self):
        diff = self.diff_of_runs({"DROPOUT_SEED": "1", "INIT_SEED": "0"}, {"DROPOUT_SEED": "1", "INIT_SEED": "1"})
        self.assertEqual(diff.returncode, 1, diff.stdout + diff.stderr)
        self.assertIn("is the initialisation seeded?", diff.stdout)
        self.assertIn("torch.manual_seed", diff.stdout)
        self.assertNotIn("candle", diff.stdout)

    def test_a_module_fed_by_unseen_code_is_not_blamed_as_an_op_that_computes_differently(self):
        diff = self.diff_of_runs({"DROPOUT_SEED": "1"}, {"DROPOUT_SEED": "2"})
        self.assertEqual(diff.returncode, 1, diff.stdout + diff.stderr)
        # The generator the dropout drew from is recorded (kind rng_state): its state is named,
        # before the module output the unseen draw changed.
        self.assertIn("first at step 0, tensor `rng.cpu` (rng_state)", diff.stdout)
        self.assertIn("root cause: `rng.cpu` (rng_state, forward) at step 0", diff.stdout)
        self.assertIn("`fc2` (op_output, forward)", diff.stdout)
        self.assertNotIn("its op computed it differently", diff.stdout)


if __name__ == "__main__":
    unittest.main()
