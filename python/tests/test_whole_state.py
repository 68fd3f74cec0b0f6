"""The whole training state in a trace (issue 72, items 2, 3 and 5): an optimizer's state after
each step (Adam's moments, the learning rate applied, a gradient scaler's scale) and the random
generators' states at each step's start. Each case changes one thing that the weights show only
later, or never, and checks that `repro diff` names it first. Skipped where torch is not
installed."""

import os
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

try:
    import torch
except ImportError:  # pragma: no cover
    torch = None

REPRO = os.environ.get("REPRO_BIN", "target/release/repro")


def train(path: str, beta2: float = 0.999, init_scale=None, seed: int = 0, dropout: float = 0.0, steps: int = 3):
    """Trains a small model with BatchNorm (and dropout) by Adam for `steps` steps, recorded into
    `path` with its optimizer (and a GradScaler of `init_scale`, where given); the data and the
    weights come from generators of their own, the global generator from `seed`."""
    from repro.torch import ModelRecorder, Recorder

    init = torch.Generator().manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Dropout(dropout),
                                torch.nn.Linear(8, 2))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=init))
    data = torch.randn(steps, 16, 4, generator=init)
    torch.manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2, betas=(0.9, beta2))
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale) if init_scale is not None else None
    rec = ModelRecorder(Recorder(path, {"workload": "whole-state", "steps": steps}, capture="none", place=None),
                        model, optimizer=opt, scaler=scaler)
    with rec:
        for step in range(steps):
            with rec.training_step(step, {"x": data[step]}) as s:
                loss = model(data[step]).pow(2).mean()
                s.loss(loss)
                (scaler.scale(loss) if scaler is not None else loss).backward()
                if scaler is not None:
                    scaler.unscale_(opt)
                s.gradients()
                if scaler is not None:
                    scaler.step(opt)
                    scaler.update()
                else:
                    opt.step()
                opt.zero_grad()
    return path


def diff(a: str, b: str) -> subprocess.CompletedProcess:
    return subprocess.run([REPRO, "diff", a, b], capture_output=True, text=True)


@unittest.skipUnless(torch is not None, "torch is not installed")
class WholeStateTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="repro-whole-state-")

    def path(self, name: str) -> str:
        return os.path.join(self.dir, name)

    def test_the_optimizer_and_generators_are_recorded_and_same_runs_are_identical(self):
        from repro.trace import Trace

        a, b = train(self.path("a"), init_scale=1024.0), train(self.path("b"), init_scale=1024.0)
        with Trace(a) as t:
            step = list(t.steps())[1]
        kinds = {r.name: r.kind for r in step.tensors}
        for name in ("0.weight.exp_avg", "0.weight.exp_avg_sq", "3.bias.exp_avg_sq", "optimizer.param_groups.0.step",
                     "optimizer.param_groups.0.lr", "optimizer.param_groups.0.betas", "scaler.scale"):
            self.assertEqual(kinds.get(name), "optimizer_state", name)
        self.assertEqual(kinds.get("rng.cpu"), "rng_state")
        result = diff(a, b)
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        self.assertIn("IDENTICAL", result.stdout)

    def test_adams_beta2_changed_is_found_at_its_moment_before_any_weight(self):
        # Adam's first update is the same whatever beta2 (its bias correction cancels it): the
        # weights differ only after the second step, the second moment from the first.
        a, b = train(self.path("a")), train(self.path("b"), beta2=0.99)
        result = diff(a, b)
        self.assertEqual(result.returncode, 1, result.stdout + result.stderr)
        # The hyper-parameter the update was computed with comes first; the moment it computed
        # differs at the same step, and every `.updated` weight only after both.
        self.assertIn("DIVERGED  first at step 0, tensor `optimizer.param_groups.0.betas` (optimizer_state)", result.stdout)
        full = subprocess.run([REPRO, "diff", "--full", a, b], capture_output=True, text=True).stdout
        self.assertRegex(full, r"0\.weight\.exp_avg_sq\s+optimizer_state\s+0\s")

    def test_a_grad_scaler_with_another_initial_scale_is_named(self):
        a, b = train(self.path("a"), init_scale=1024.0), train(self.path("b"), init_scale=2048.0)
        result = diff(a, b)
        self.assertEqual(result.returncode, 1, result.stdout + result.stderr)
        self.assertIn("DIVERGED  first at step 0, tensor `scaler.scale` (optimizer_state)", result.stdout)

    def test_an_unseeded_draw_is_named_by_the_generator_state_that_differs(self):
        # Dropout draws from the global generator, seeded differently: the masks are not in the
        # trace, but the generator's state at the first step's start is, and it is the root cause.
        a, b = train(self.path("a"), dropout=0.5), train(self.path("b"), dropout=0.5, seed=1)
        result = diff(a, b)
        self.assertEqual(result.returncode, 1, result.stdout + result.stderr)
        self.assertIn("DIVERGED  first at step 0, tensor `rng.cpu` (rng_state)", result.stdout)
        self.assertIn("root cause: `rng.cpu` (rng_state, forward) at step 0", result.stdout)
        self.assertIn("a random generator's state", result.stdout)


if __name__ == "__main__":
    unittest.main()
