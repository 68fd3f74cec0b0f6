"""The PyTorch studies (`python -m repro.study`) on the CPU, at sizes that run in seconds: the
cost study's rows, resuming and refusing; the noise study's variants; the identity workaround for
pools that refuse deterministic mode; a divergence named by module, pass and op. Skipped where
torch is not installed."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest
from unittest import mock

try:
    import torch
    from torch import nn
except ImportError:  # pragma: no cover
    torch = None

PYTHON_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
REPRO = os.path.abspath(os.environ.get("REPRO_BIN", "target/release/repro"))


def study(*args):
    env = {**os.environ, "REPRO_BIN": REPRO, "PYTHONPATH": PYTHON_DIR}
    return subprocess.run([sys.executable, "-m", "repro.study", *args], capture_output=True, text=True, env=env)


@unittest.skipUnless(torch, "torch is not installed")
class StudyTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="repro-study-")

    def tearDown(self):
        shutil.rmtree(self.dir)

    def test_the_cost_study_times_both_modes_compares_twin_runs_and_resumes(self):
        out = os.path.join(self.dir, "cost")
        args = ["cost", "--models", "medium_cnn_k1", "--side", "64", "--batch", "2", "--timed", "2", "--warmup",
                "1", "--device", "cpu", "--out", out]
        done = study(*args)
        self.assertEqual(done.returncode, 0, done.stderr)
        with open(os.path.join(out, "cost", "medium_cnn_k1.json")) as f:
            row = json.load(f)
        self.assertEqual(set(row["modes"]), {"default", "deterministic", "deterministic-nofill"})
        for mode in row["modes"].values():
            self.assertTrue(mode["identical"], mode)  # the CPU's kernels are deterministic
            self.assertIsNone(mode["kernel_ms"])  # no GPU, no kernel time
            self.assertEqual(len(mode["steps"]), 2)
            for trace in mode["traces"]:
                self.assertTrue(os.path.exists(os.path.join(trace, "records.rpr")), trace)
        self.assertGreater(row["modes"]["deterministic-nofill"]["step_ms"], 0)
        self.assertIsNone(row["refusal"])
        with open(os.path.join(out, "cost.md")) as f:
            page = f.read()
        self.assertIn("| medium_cnn_k1 |", page)
        self.assertIn("2.84x / 1.29x / 1.17x", page)  # seed 004's ratios at 1×1
        again = study(*args)
        self.assertEqual(again.returncode, 0, again.stderr)
        self.assertIn("medium_cnn_k1: measured before", again.stderr)

    def test_the_cost_study_refuses_what_it_cannot_run_by_name(self):
        for args, said in ((["--models", "resnet51"], "no network called 'resnet51'"),
                           (["--models", "small_cnn", "--batch", "0"], "--batch 0"),
                           (["--models", "small_cnn", "--side", "64"], "small_cnn at batch 64, 64×64")):
            done = study("cost", "--device", "cpu", "--out", os.path.join(self.dir, "x"), *args)
            self.assertEqual(done.returncode, 2, done.stderr)
            self.assertIn(said, done.stderr)

    def test_the_noise_study_separates_seeds_from_the_implementation(self):
        out = os.path.join(self.dir, "noise")
        done = study("noise", "--models", "small_cnn", "--runs", "2", "--epochs", "1", "--examples", "512,256",
                     "--batch", "64", "--device", "cpu", "--out", out)
        self.assertEqual(done.returncode, 0, done.stderr)
        with open(os.path.join(out, "noise.json")) as f:
            variants = json.load(f)["networks"]["small_cnn"]
        self.assertEqual(set(variants), {"control", "algo", "impl", "algo+impl"})
        # The same seed on the CPU is the same model; other seeds are another.
        for same in ("control", "impl"):
            self.assertEqual((variants[same]["churn"], variants[same]["l2"], variants[same]["identical_runs"]),
                             (0.0, 0.0, 1), same)
        self.assertGreater(variants["algo"]["l2"], 0.1)
        self.assertEqual(variants["algo"]["identical_runs"], 0)
        self.assertIn("first_divergence", variants["impl"])
        self.assertIsNone(variants["impl"]["first_divergence"])  # repro diff: identical
        with open(os.path.join(out, "noise.md")) as f:
            self.assertIn("| small_cnn | impl |", f.read())

    def test_a_pool_as_large_as_its_input_becomes_the_identity_with_the_same_bits(self):
        from repro.study.modes import identity_pools

        torch.manual_seed(0)
        model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.AdaptiveAvgPool2d(7),
                              nn.Sequential(nn.AdaptiveAvgPool2d(1)), nn.Flatten(), nn.Linear(4, 2))
        x = torch.randn(2, 3, 7, 7)

        def outputs_and_gradients(m):
            m.zero_grad()
            y = m(x)
            y.sum().backward()
            return [y.detach().clone()] + [p.grad.clone() for p in m.parameters()]

        before = outputs_and_gradients(model)
        self.assertEqual(identity_pools(model, x[:1]), ["1"])  # the 7×7 → 1 pool stays
        self.assertIsInstance(model[1], nn.Identity)
        self.assertIsInstance(model[2][0], nn.AdaptiveAvgPool2d)
        for a, b in zip(before, outputs_and_gradients(model)):
            self.assertTrue(torch.equal(a, b))

    def test_a_refusal_names_its_op(self):
        from repro.study.modes import refused_op

        error = RuntimeError("adaptive_avg_pool2d_backward_cuda does not have a deterministic implementation, but "
                             "you set 'torch.use_deterministic_algorithms(True)'.")
        self.assertEqual(refused_op(error), "adaptive_avg_pool2d_backward_cuda")
        self.assertIsNone(refused_op(RuntimeError("CUDA out of memory")))

    def test_two_runs_that_differ_are_named_by_module_pass_and_op(self):
        from repro.study import twins
        from repro.study.models import small_cnn

        patched = mock.patch.dict(os.environ, {"REPRO_BIN": REPRO})
        patched.start()
        self.addCleanup(patched.stop)
        x, y = torch.randn(4, 3, 32, 32), torch.tensor([0, 1, 2, 3])
        traces = []
        for run, lr in (("a", 0.1), ("b", 0.1000001)):
            torch.manual_seed(0)
            model = small_cnn()
            opt = torch.optim.SGD(model.parameters(), lr=lr)

            def step(s, i):
                opt.zero_grad()
                loss = nn.functional.cross_entropy(model(x), y)
                s.loss(loss)
                loss.backward()
                s.gradients()
                opt.step()

            traces.append(os.path.join(self.dir, run))
            twins.record(traces[-1], {"workload": "study-test"}, model, 2, step, lambda i: {"x": x})
        found = twins.compare(*traces, model)
        # Step 0 is the same; the learning rate moves the first update.
        self.assertEqual((found.step, found.phase), (0, "update"))
        self.assertEqual(found.module, "0")
        self.assertEqual(found.module_type, "Conv2d")
        self.assertIsNone(found.op)
        described = twins.describe({"step": 3, "tensor": "6.weight.grad", "phase": "backward"}, "leaf", model, 1, 9)
        self.assertEqual((described.module, described.module_type, described.op),
                         ("6", "Conv2d", "aten.convolution_backward"))


if __name__ == "__main__":
    unittest.main()
