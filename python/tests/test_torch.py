"""repro_torch against repro: a PyTorch program recorded through the environment contract,
gated, and a fault planted in one module's output found there. Skipped where torch is not
installed (CI runs the torch-free writer tests; the GPU machine has torch)."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

try:
    import torch  # noqa: F401
except ImportError:  # pragma: no cover
    torch = None

REPRO = os.environ.get("REPRO_BIN", "target/release/repro")
PROGRAM = os.path.join(os.path.dirname(__file__), "..", "examples", "torch_mlp.py")


def repro(*args, env=None):
    return subprocess.run([REPRO, *args], capture_output=True, text=True, env=env)


@unittest.skipUnless(torch, "torch is not installed")
class TorchTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="repro-torch-")

    def tearDown(self):
        shutil.rmtree(self.dir)

    def test_a_pytorch_program_is_recorded_gated_and_its_fault_found(self):
        a, b = os.path.join(self.dir, "a"), os.path.join(self.dir, "b")
        cmd = [sys.executable, PROGRAM]
        run = repro("record", "--out", a, "--capture", "all", "--", *cmd)
        self.assertEqual(run.returncode, 0, run.stderr)
        inspect = repro("inspect", a, "--verify")
        self.assertEqual(inspect.returncode, 0, inspect.stdout + inspect.stderr)
        self.assertIn("torch-mlp", inspect.stdout)
        # Module outputs by module path, parameters by state_dict name, gradients, updates.
        show = repro("show", a, "--step", "0")
        for name in ("0.weight", "0", "1", "2", "loss", "0.weight.grad", "2.bias.updated"):
            self.assertRegex(show.stdout, rf"(?m)^\s*{name}\s", show.stdout)

        gate = repro("gate", "--", *cmd)
        self.assertEqual(gate.returncode, 0, gate.stdout + gate.stderr)
        self.assertIn("PASS", gate.stdout)

        # A 2-ULP fault in the Tanh's output at step 3: the first module output that differs
        # while every input and parameter is identical.
        env = dict(os.environ, REPRO_PERTURB="3:1:2")
        run = repro("record", "--out", b, "--capture", "all", "--", *cmd, env=env)
        self.assertEqual(run.returncode, 0, run.stderr)
        diff = repro("diff", a, b)
        self.assertEqual(diff.returncode, 1, diff.stdout + diff.stderr)
        self.assertIn("DIVERGED  first at step 3, tensor `1`", diff.stdout)
        self.assertIn("root cause: `1` (op_output, forward) at step 3", diff.stdout)
        self.assertIn("max 2 ULP", diff.stdout)


    def test_the_gpt_and_its_pytorch_twin_agree_within_a_tolerance(self):
        candle, twin = os.path.join(self.dir, "candle"), os.path.join(self.dir, "twin")
        settings = ["--steps", "4", "--layers", "1", "--width", "32", "--heads", "2", "--context", "16", "--batch", "2"]
        run = repro("record", "--workload", "gpt", "--capture", "all", "--out", candle, *settings)
        self.assertEqual(run.returncode, 0, run.stderr)
        examples = os.path.join(os.path.dirname(__file__), "..", "examples")
        made = subprocess.run([sys.executable, os.path.join(examples, "gpt_twin.py"), candle, twin], capture_output=True,
                              text=True)
        self.assertEqual(made.returncode, 0, made.stderr)
        mapping = os.path.join(examples, "gpt_twin.map")
        # Same initial weights and batches: the parameters and inputs pair by name and agree at
        # step 0; the runs first part in the loss or the backward pass (other summation orders).
        diff = repro("diff", candle, twin, "--map", mapping, "--json")
        self.assertEqual(diff.returncode, 1, diff.stderr)
        report = json.loads(diff.stdout)
        first = report["first_divergence"]
        self.assertEqual(first["step"], 0, first)
        self.assertIn(first["kind"], ("loss", "gradient"), first)
        self.assertIn(report["root_cause"]["rule"], ("identical_leaves", "backward"), report["root_cause"])
        # Within 1e-3 of each other over the whole run.
        within = repro("diff", candle, twin, "--map", mapping, "--tolerance", "abs:1e-3")
        self.assertEqual(within.returncode, 0, within.stdout)
        self.assertIn("WITHIN TOLERANCE", within.stdout)


if __name__ == "__main__":
    unittest.main()
