"""repro.torch against repro: a PyTorch program recorded through the environment contract,
gated, and a fault planted in one module's output found there; the determinism switches in the
header, the program's line as a module output's source, a planted fault that gradients flow
through, buffers (a BatchNorm's momentum found at its running statistics), and the capture
ladder's levels (module outputs at the steps asked for, every aten op's output at others, a
divergence found at its op). Skipped where
torch is not installed (CI runs the torch-free writer tests; the GPU machine has torch)."""

import contextlib
import inspect
import io
import json
import dataclasses
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest
from unittest import mock

import numpy as np

try:
    import torch  # noqa: F401
except ImportError:  # pragma: no cover
    torch = None

# The CPU stand-in of the GPU hashing library beside this file, however the tests are run.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cpu_hash_library import hash_on_cpu_stand_in  # noqa: E402
from recorded_program import TRAINING_LOOP  # noqa: E402
from spec_hash import tensor_hash  # noqa: E402

REPRO = os.environ.get("REPRO_BIN", "target/release/repro")
PROGRAM = os.path.join(os.path.dirname(__file__), "..", "examples", "torch_mlp.py")


# The directory of the Python project these tests are part of (its pyproject.toml): where a
# module output's `source` names this file from.
PYTHON_PROJECT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A program of named modules that records three training steps with settings beside its
# workload (its seed from SEED), into its first argument: `write_named_program` writes it.
NAMED_PROGRAM = """\
import os
import sys
from collections import OrderedDict

import torch

from repro.torch import ModelRecorder

seed = int(os.environ.get("SEED", "0"))
torch.manual_seed(seed)
model = torch.nn.Sequential(OrderedDict(encoder=torch.nn.Linear(4, 8), act=torch.nn.Tanh(), decoder=torch.nn.Linear(8, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
run = {"workload": "named", "steps": 3, "seed": seed, "batch": 8, "bf16": False}
rec = ModelRecorder.create_or_gated(sys.argv[1] if len(sys.argv) > 1 else "runs/named", run, model)
""" + TRAINING_LOOP.format(steps=3, each_step="")


def repro(*args, env=None):
    return subprocess.run([REPRO, *args], capture_output=True, text=True, env=env)


def write_named_program(directory: str) -> str:
    """Writes `NAMED_PROGRAM` as `train.py` in `directory` (made if missing); its path."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "train.py")
    with open(path, "w") as f:
        f.write(NAMED_PROGRAM)
    return path


def program_env(**variables) -> dict:
    """This environment with `variables`, for a program run from any directory: repro.torch on
    its PYTHONPATH by absolute path, and no REPRO_ variable of the caller's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("REPRO_")}
    env["PYTHONPATH"] = PYTHON_PROJECT
    env.update(variables)
    return env


def _header_env(path):
    """The `env` map of a trace's header environment."""
    from repro.trace import Trace

    with Trace(path) as t:
        return t.header["environment"]["env"]


def source_line(function, text: str) -> str:
    """The `source` of `function`'s line that holds `text`: this file from its project's root."""
    lines, first = inspect.getsourcelines(function)
    here = os.path.relpath(os.path.abspath(__file__), PYTHON_PROJECT)
    return f"{here}:{first + next(i for i, line in enumerate(lines) if text in line)}"


def train_three_steps(rec, run, opt) -> None:
    """Three recorded training steps of `run` (a model taking 8 features to 2) on one random batch,
    its input recorded as `x`."""
    x, y = torch.randn(4, 8), torch.randn(4, 2)
    for step in range(3):
        opt.zero_grad()
        with rec.training_step(step, inputs={"x": x}) as s:
            loss = torch.nn.functional.mse_loss(run(x), y)
            s.loss(loss)
            loss.backward()
            s.gradients()
            opt.step()


@unittest.skipUnless(torch, "torch is not installed")
class TorchTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="repro-torch-")

    def tearDown(self):
        shutil.rmtree(self.dir)

    def test_a_compiled_model_records_its_parameters_loss_gradients_and_updates_and_says_what_it_cannot(self):
        from repro.torch import ModelRecorder, Recorder

        def train(path, compile_it):
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
            run = torch.compile(model, backend="eager") if compile_it else model
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            stderr = io.StringIO()
            with contextlib.redirect_stderr(stderr):
                # The plain run leaves module outputs out too, to compare with the compiled one,
                # which the recorder asked for at its first step.
                rec = ModelRecorder(Recorder(path, {"workload": "compiled"}), run,
                                    modules="first" if compile_it else "none")
            train_three_steps(rec, run, opt)
            self.assertEqual(rec.finish(), 3)
            return stderr.getvalue()

        plain, compiled = os.path.join(self.dir, "plain"), os.path.join(self.dir, "compiled")
        self.assertEqual(train(plain, False), "")
        note = train(compiled, True)
        self.assertIn("compiled by torch.compile: its module outputs are not recorded", note)
        # The uncompiled model's names (no `_orig_mod.`), and the same bits as eager PyTorch.
        diff = repro("diff", plain, compiled)
        self.assertEqual(diff.returncode, 0, diff.stdout + diff.stderr)
        self.assertIn("IDENTICAL", diff.stdout)
        from repro.trace import Trace

        with Trace(compiled) as t:
            names = [r.name for r in next(iter(t.steps())).tensors]
            # The header says what was recorded: no module outputs.
            self.assertEqual(t.header["capture"]["modules"], ("none",))
        self.assertIn("0.weight.grad", names)
        self.assertIn("2.bias.updated", names)
        # The `ops` level of a compiled model: what the dispatcher sees, said so (issue 67, item 5).
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
        stderr = io.StringIO()
        with contextlib.redirect_stderr(stderr):
            rec = ModelRecorder(Recorder(os.path.join(self.dir, "ops"), {"workload": "compiled"}),
                                torch.compile(model, backend="eager"), ops="all")
        self.assertIn("the `ops` level records the aten ops PyTorch's dispatcher runs outside its compiled graphs",
                      stderr.getvalue())
        rec.finish()

    def test_a_recorder_is_a_context_manager_that_unhooks_and_finishes_also_on_an_exception(self):
        # Issue 68, item 2.
        from repro.torch import ModelRecorder, Recorder
        from repro.trace import Trace
        from repro.writer import WriteError

        def model():
            torch.manual_seed(0)
            return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))

        ok, failed = os.path.join(self.dir, "ok"), os.path.join(self.dir, "failed")
        net = model()
        with ModelRecorder(Recorder(ok, {"workload": "with"}), net, modules="all") as rec:
            train_three_steps(rec, net, torch.optim.SGD(net.parameters(), lr=0.1))
        self.assertTrue(rec.recorder.finished)
        with self.assertRaisesRegex(WriteError, "finished already"):
            rec.finish()
        with Trace(ok) as t:
            self.assertEqual(len(list(t.steps())), 3)
            self.assertTrue(t.complete)
        net = model()
        with self.assertRaisesRegex(ValueError, "the data ran out"):
            with ModelRecorder(Recorder(failed, {"workload": "with"}), net, modules="all") as rec:
                train_three_steps(rec, net, torch.optim.SGD(net.parameters(), lr=0.1))
                with rec.training_step(3):
                    net(torch.randn(4, 8))  # hooked at this step
                    raise ValueError("the data ran out")
        self.assertFalse(any(m._forward_hooks for m in net.modules()), "the recorder's hooks stay on the model")
        with Trace(failed) as t:
            self.assertEqual([s.step for s in t.steps()], [0, 1, 2])
            self.assertFalse(t.complete)
            self.assertIn("stopped early: the program raised ValueError", t.incomplete_reason)

    def _record_batch_norm_cnn(self, name, momentum, capture="first-and-last", stand_in=False):
        """Records three training steps of a small CNN with a BatchNorm of `momentum` (and a
        non-persistent buffer of its own) into `name` under the capture policy `capture`, hashing
        through the CPU stand-in of the GPU library with `stand_in` (else on the host); the trace
        and the trained model."""
        from repro.torch import ModelRecorder, Recorder

        class Cnn(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.conv = torch.nn.Conv2d(1, 4, 3)
                self.bn = torch.nn.BatchNorm2d(4, momentum=momentum)
                self.head = torch.nn.Linear(4 * 4 * 4, 3)
                self.register_buffer("scale", torch.full((4,), 0.5), persistent=False)

            def forward(self, x):
                h = torch.relu(self.bn(self.conv(x))) * self.scale.view(1, 4, 1, 1)
                return self.head(h.flatten(1))

        torch.manual_seed(0)
        model = Cnn()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        path = os.path.join(self.dir, name)
        recorder = Recorder(path, {"workload": "batch-norm-cnn", "steps": 3}, capture=capture)
        if stand_in:
            hash_on_cpu_stand_in(recorder)
        rec = ModelRecorder(recorder, model)
        data = torch.Generator().manual_seed(1)
        for step in range(3):
            x, y = torch.randn(8, 1, 6, 6, generator=data), torch.randint(0, 3, (8,), generator=data)
            opt.zero_grad()
            with rec.training_step(step, inputs={"x": x, "y": y}) as s:
                loss = torch.nn.functional.cross_entropy(model(x), y)
                s.loss(loss)
                loss.backward()
                s.gradients()
                opt.step()
        self.assertEqual(rec.finish(), 3)
        return path, model

    def test_buffers_are_recorded_and_batch_norm_s_momentum_diverges_at_its_running_statistics(self):
        from repro.trace import Trace, read_tensor

        a, model = self._record_batch_norm_cnn("a", 0.1)
        same, _ = self._record_batch_norm_cnn("same", 0.1)
        other, _ = self._record_batch_norm_cnn("other", 0.2)
        # Every buffer, the non-persistent one and the integer counter included, by module path,
        # before and after each step; after the last, as the model's state holds it.
        buffers = ["bn.running_mean", "bn.running_var", "bn.num_batches_tracked", "scale"]
        self.assertEqual(sorted(n for n, _ in model.named_buffers()), sorted(buffers))
        with Trace(a) as t:
            steps = list(t.steps())
        for s in steps:
            kinds = {x.name: (x.kind, x.phase) for x in s.tensors}
            for name in buffers:
                self.assertEqual(kinds[name], ("buffer", "forward"), (s.step, name))
                self.assertEqual(kinds[f"{name}.updated"], ("buffer", "update"), (s.step, name))
        self.assertEqual(next(x.dtype for x in steps[0].tensors if x.name == "bn.num_batches_tracked"), "I64")
        for name in buffers:
            np.testing.assert_array_equal(read_tensor(a, 2, f"{name}.updated"), dict(model.named_buffers())[name])
        np.testing.assert_array_equal(read_tensor(a, 0, "bn.num_batches_tracked"), 0)
        np.testing.assert_array_equal(read_tensor(a, 2, "bn.num_batches_tracked.updated"), 3)

        diff = repro("diff", a, same)
        self.assertEqual(diff.returncode, 0, diff.stdout + diff.stderr)
        self.assertIn("IDENTICAL", diff.stdout)
        # Another momentum changes the running statistics alone: the first step's forward pass,
        # gradients and update are identical, its running mean after the step is not.
        diff = repro("diff", a, other)
        self.assertEqual(diff.returncode, 1, diff.stdout + diff.stderr)
        self.assertIn("DIVERGED  first at step 0, tensor `bn.running_mean.updated` (buffer", diff.stdout)

    def test_buffers_hashed_through_the_gpu_library_hash_as_on_the_host(self):
        # BatchNorm changes its running statistics in place without moving their version
        # counters: the recorder must still hash them anew, not repeat the step's first record.
        from repro.trace import Trace

        host, _ = self._record_batch_norm_cnn("host", 0.1, capture="none")
        device, _ = self._record_batch_norm_cnn("device", 0.1, capture="none", stand_in=True)

        def hashes(path):
            with Trace(path) as t:
                return [(s.step, x.name, x.hash) for s in t.steps() for x in s.tensors]

        self.assertEqual(hashes(device), hashes(host))

    def test_a_pytorch_program_is_recorded_gated_and_its_fault_found(self):
        a, b = os.path.join(self.dir, "a"), os.path.join(self.dir, "b")
        cmd = [sys.executable, PROGRAM]
        run = repro("record", "--out", a, "--capture", "all", "--", *cmd)
        self.assertEqual(run.returncode, 0, run.stderr)
        inspect = repro("inspect", a, "--verify")
        self.assertEqual(inspect.returncode, 0, inspect.stdout + inspect.stderr)
        self.assertIn("torch-mlp", inspect.stdout)
        # torch's version under its own name; no candle, no empty compiler (issue 66, item 12).
        self.assertRegex(inspect.stdout, rf"(?m)^  torch +{re.escape(torch.__version__)}$")
        self.assertNotRegex(inspect.stdout, r"(?m)^  (candle|rustc) ")
        # Module outputs by module path, parameters by state_dict name, gradients, updates.
        show = repro("show", a, "--step", "0")
        for name in ("0.weight", "0", "1", "2", "loss", "0.weight.grad", "2.bias.updated"):
            self.assertRegex(show.stdout, rf"(?m)^\s*{name}\s", show.stdout)

        gate = repro("gate", "--", *cmd)
        self.assertEqual(gate.returncode, 0, gate.stdout + gate.stderr)
        self.assertIn("PASS", gate.stdout)

        # A 2-ULP fault in the Tanh's output at step 0, whose module outputs the default levels
        # record: the first module output that differs while every input and parameter is
        # identical.
        env = dict(os.environ, REPRO_PERTURB="0:1:2")
        run = repro("record", "--out", b, "--capture", "all", "--", *cmd, env=env)
        self.assertEqual(run.returncode, 0, run.stderr)
        diff = repro("diff", a, b)
        self.assertEqual(diff.returncode, 1, diff.stdout + diff.stderr)
        self.assertIn("DIVERGED  first at step 0, tensor `1`", diff.stdout)
        self.assertIn("root cause: `1` (op_output, forward) at step 0", diff.stdout)
        self.assertIn("max 2 ULP", diff.stdout)


    def test_a_program_recorded_with_xxh3_1k_compares_with_its_kind_and_is_refused_against_blake3(self):
        from repro.trace import Trace

        cmd = [sys.executable, PROGRAM]
        runs = {name: os.path.join(self.dir, name) for name in ("x1", "x2", "b3")}
        for name in ("x1", "x2"):
            run = repro("record", "--data-hash", "xxh3-1k", "--out", runs[name], "--capture", "all", "--", *cmd)
            self.assertEqual(run.returncode, 0, run.stderr)
        run = repro("record", "--out", runs["b3"], "--capture", "none", "--", *cmd)
        self.assertEqual(run.returncode, 0, run.stderr)
        with Trace(runs["x1"]) as t:
            self.assertEqual((t.version, t.data_hash), ((2, 1), "xxh3-1k"))
        with Trace(runs["b3"]) as t:
            self.assertEqual((t.version, t.data_hash), ((1, 10), "blake3"))
        inspect = repro("inspect", runs["x1"], "--verify")
        self.assertEqual(inspect.returncode, 0, inspect.stdout + inspect.stderr)
        same = repro("diff", runs["x1"], runs["x2"])
        self.assertEqual(same.returncode, 0, same.stdout + same.stderr)
        self.assertIn("IDENTICAL", same.stdout)
        mixed = repro("diff", runs["x1"], runs["b3"])
        self.assertEqual(mixed.returncode, 2, mixed.stdout + mixed.stderr)
        self.assertIn("hashes its tensors with xxh3-1k", mixed.stderr)

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

    def test_determinism_switches_are_in_the_header_and_diff_names_those_that_differ(self):
        from repro.torch import Recorder

        before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
                  torch.backends.cudnn.benchmark, torch.backends.cuda.matmul.allow_tf32)
        paths = []
        try:
            for name, switched, workspace in (("a", False, None), ("b", True, ":4096:8")):
                torch.use_deterministic_algorithms(switched)
                torch.backends.cudnn.benchmark = switched
                torch.backends.cuda.matmul.allow_tf32 = switched
                path = os.path.join(self.dir, name)
                with mock.patch.dict(os.environ):
                    os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
                    os.environ.update({"CUBLAS_WORKSPACE_CONFIG": workspace} if workspace else {})
                    rec = Recorder(path, {"workload": "switches", "steps": 1})
                with rec.step(0) as s:
                    s.record("x", torch.ones(3), "input")
                rec.finish()
                paths.append(path)
        finally:
            torch.use_deterministic_algorithms(before[0], warn_only=before[1])
            torch.backends.cudnn.benchmark, torch.backends.cuda.matmul.allow_tf32 = before[2:]
        a, b = (_header_env(p) for p in paths)
        for switch in ("torch.use_deterministic_algorithms", "torch.backends.cudnn.benchmark",
                       "torch.backends.cuda.matmul.allow_tf32"):
            self.assertEqual((a[switch], b[switch]), ("False", "True"), switch)
        self.assertEqual(a["torch.backends.cudnn.deterministic"], b["torch.backends.cudnn.deterministic"])
        self.assertIn("torch.backends.cudnn.allow_tf32", a)
        self.assertNotIn("CUBLAS_WORKSPACE_CONFIG", a)
        self.assertEqual(b["CUBLAS_WORKSPACE_CONFIG"], ":4096:8")
        # The same values under other switches: identical, and the switches listed as the
        # environment's differences.
        diff = repro("diff", *paths)
        self.assertEqual(diff.returncode, 0, diff.stdout + diff.stderr)
        for line in ("env.torch.use_deterministic_algorithms: False | True",
                     "env.torch.backends.cudnn.benchmark: False | True",
                     "env.torch.backends.cuda.matmul.allow_tf32: False | True",
                     "env.CUBLAS_WORKSPACE_CONFIG: (unset) | :4096:8"):
            self.assertIn(line, diff.stdout)
        self.assertNotIn("env.torch.backends.cudnn.deterministic", diff.stdout)

    def test_mixed_precision_records_the_dtypes_the_program_used(self):
        # bf16 autocast, and fp16 autocast with a gradient scaler: module outputs in the
        # autocast dtype, parameters, gradients (as scaled when recorded) and updates in f32.
        from repro.torch import ModelRecorder, Recorder
        from repro.trace import Trace

        for dtype, name in ((torch.bfloat16, "BF16"), (torch.float16, "F16")):
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            scaler = torch.amp.GradScaler("cpu", init_scale=1024.0) if dtype == torch.float16 else None
            path = os.path.join(self.dir, name)
            rec = ModelRecorder(Recorder(path, {"workload": "amp", "steps": 2}, capture="none"), model)
            x = torch.randn(4, 8)
            for step in range(2):
                opt.zero_grad()
                with rec.training_step(step, inputs={"x": x}) as s:
                    with torch.autocast("cpu", dtype=dtype):
                        loss = model(x).float().square().mean()
                    s.loss(loss)
                    (scaler.scale(loss) if scaler else loss).backward()
                    s.gradients()
                    if scaler:
                        scaler.step(opt)
                        scaler.update()
                    else:
                        opt.step()
            rec.finish()
            with Trace(path) as t:
                dtypes = {r.name: r.dtype for r in next(iter(t.steps())).tensors}
            self.assertEqual({dtypes[n] for n in ("0", "1", "2")}, {name}, dtypes)
            self.assertEqual(dtypes["loss"], "F32")
            self.assertEqual({dtypes[n] for n in dtypes if n.endswith((".grad", ".updated", ".weight", ".bias"))},
                             {"F32"}, dtypes)

    def test_a_module_output_s_source_is_the_program_s_line_that_called_it(self):
        from repro.torch import ModelRecorder, Recorder
        from repro.trace import Trace

        nn = torch.nn

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(4, 8)
                self.body = nn.Sequential(nn.Linear(8, 8), nn.Tanh())

            def forward(self, x):
                h = self.fc(x)
                return self.body(h).sum()

        lines, first = inspect.getsourcelines(Net.forward)
        here = os.path.relpath(os.path.abspath(__file__), PYTHON_PROJECT)  # from its project's root
        at = {call: f"{here}:{first + next(i for i, line in enumerate(lines) if call in line)}"
              for call in ("self.fc(", "self.body(")}
        model = Net()
        path = os.path.join(self.dir, "sources")
        rec = ModelRecorder(Recorder(path, {"workload": "sources", "steps": 1}), model)
        with rec.training_step(0, inputs={"x": torch.ones(2, 4)}) as s:
            s.loss(model(torch.ones(2, 4)))
        rec.finish()
        with Trace(path) as t:
            sources = {x.name: x.source for s in t.steps() for x in s.tensors if x.source is not None}
        # The Sequential's children are called from torch's container.py: they name the line
        # that called the Sequential.
        self.assertEqual(sources, {"fc": at["self.fc("], "body.0": at["self.body("], "body.1": at["self.body("],
                                   "body": at["self.body("]})

    def _record_levels(self, name, steps=3, first=0, eps=0.0, stand_in=False, **levels):
        """Records `steps` training steps of `LevelsNet(eps)`, numbered from `first`, into `name`
        at the levels `levels` (the recorder's `modules` and `ops`), hashing through the CPU
        stand-in of the GPU library with `stand_in`; the trace, and the number of forward hooks
        and pre-hooks on the model's modules inside each step's block."""
        from repro.torch import ModelRecorder, Recorder

        torch.manual_seed(0)
        model = LevelsNet(eps)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, foreach=False)  # one `aten.add_` a parameter
        path = os.path.join(self.dir, name)
        recorder = Recorder(path, {"workload": "levels", "steps": steps}, capture="none", **levels)
        if stand_in:
            hash_on_cpu_stand_in(recorder)
        rec = ModelRecorder(recorder, model)
        data = torch.Generator().manual_seed(1)
        hooks = []
        for step in range(first, first + steps):
            x, y = torch.randn(8, 1, 6, 6, generator=data), torch.randint(0, 3, (8,), generator=data)
            opt.zero_grad()
            with rec.training_step(step, inputs={"x": x, "y": y}) as s:
                hooks.append(sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules()))
                loss = torch.nn.functional.cross_entropy(model(x), y)
                s.loss(loss)
                loss.backward()
                s.gradients()
                opt.step()
        self.assertEqual(rec.finish(), steps)
        return path, hooks

    def test_module_outputs_are_recorded_at_the_first_step_by_default_and_at_the_steps_asked_for(self):
        from repro.trace import Trace

        modules = ["block.0", "block.1", "block.2", "block", "shift", "head"]

        def outputs(path):
            """Each step's module outputs, and the header's levels."""
            with Trace(path) as t:
                levels = (t.header["capture"]["modules"], t.header["capture"]["ops"])
                return {s.step: [x.name for x in s.tensors if x.name in modules] for s in t.steps()}, levels

        # By default the first step recorded (here step 5) alone, and only its block runs hooks.
        default, hooks = self._record_levels("default", first=5)
        self.assertEqual(outputs(default), ({5: modules, 6: [], 7: []}, (("first",), ("none",))))
        self.assertEqual(hooks, [len(modules), 0, 0])
        every, hooks = self._record_levels("every", modules="all")
        self.assertEqual(outputs(every), ({0: modules, 1: modules, 2: modules}, (("all",), ("none",))))
        self.assertEqual(hooks, [len(modules)] * 3)
        none, hooks = self._record_levels("none", modules="none")
        self.assertEqual(outputs(none), ({0: [], 1: [], 2: []}, (("none",), ("none",))))
        self.assertEqual(hooks, [0, 0, 0])
        # The steps level is the same whatever the other levels record.
        with Trace(every) as a, Trace(none) as b:
            self.assertEqual([[(x.name, x.hash) for x in s.tensors if x.name not in modules] for s in a.steps()],
                             [[(x.name, x.hash) for x in s.tensors] for s in b.steps()])

    def test_the_ops_level_records_every_aten_op_forward_and_backward_by_module_path_with_its_source(self):
        from repro.trace import Trace

        path, hooks = self._record_levels("ops", ops="steps:1")
        # Module outputs at the first step; at step 1 a pre-hook and a forward hook a module,
        # which keep the path of the module whose forward runs.
        self.assertEqual(hooks, [6, 12, 0])
        with Trace(path) as t:
            self.assertEqual(t.header["capture"]["ops"], ("steps", [1]))
            steps = {s.step: s.tensors for s in t.steps()}
        op_records = {step: [x for x in tensors if "aten." in x.name] for step, tensors in steps.items()}
        self.assertEqual((op_records[0], op_records[2]), ([], []))
        ops = {x.name: x for x in op_records[1]}
        # The step's graph: its op outputs and its loss, numbered in the order they ran.
        nodes = [x for x in steps[1] if x.node is not None]
        self.assertEqual([x.node for x in nodes], list(range(len(nodes))))
        self.assertEqual({x.name for x in nodes} - set(ops), {"loss"})
        self.assertEqual({x.kind for x in ops.values()}, {"op_output"})
        block, head = source_line(LevelsNet.forward, "self.block("), source_line(LevelsNet.forward, "self.head(")
        loss, step = source_line(self._record_levels, "cross_entropy"), source_line(self._record_levels, "opt.step(")
        expected = {
            # The forward pass: each op in the innermost module running it, at the innermost line
            # of the program's code (a torch module's: the line that called it, or for the
            # children of a Sequential, the Sequential; the program's module's: the op's line).
            "block.0/aten.convolution#0": ("forward", block),
            "block.1/aten.add_#0": ("forward", block),  # the batch norm's num_batches_tracked += 1
            "block.1/aten.native_batch_norm.0#2": ("forward", block),  # (#1: an `empty`, uninitialized)
            "block.2/aten.relu_#0": ("forward", block),  # in place: its output is recorded
            "shift/aten.add#0": ("forward", source_line(Shift.forward, "h + self.eps")),
            "head/aten.addmm#1": ("forward", head),  # (#0: the weight's transpose, a view)
            "aten._log_softmax#1": ("forward", loss),  # the root's: #0 the flatten, a view
            "aten.nll_loss_forward.0#3": ("forward", loss),
            # The backward pass: each op in the module whose forward op made the autograd node
            # running it, at that op's line.
            "aten.nll_loss_backward#5": ("backward", loss),
            "head/aten.mm#3": ("backward", head),
            "block.2/aten.threshold_backward#3": ("backward", block),
            "block.1/aten.native_batch_norm_backward.0#3": ("backward", block),
            "block.0/aten.convolution_backward.1#1": ("backward", block),  # the weight's gradient
            "block.0/aten.convolution_backward.2#1": ("backward", block),  # the bias's
            # Once the gradients are recorded, the optimizer's ops are the update's (of the
            # root: no module's forward runs them).
            "aten.add_#10": ("update", step),
        }
        self.assertEqual({name: (ops[name].phase, ops[name].source) for name in expected if name in ops}, expected)
        self.assertEqual(len([x for x in op_records[1] if x.phase == "update"]), 6)  # one a parameter
        # No views (their values are their bases'), no uninitialized memory, none of the
        # recorder's own copies; and the convolution's input, which needs no gradient, gets none.
        for left_out in ("aten.t#", "aten.view", "aten.detach", "aten.empty", "aten.clone", "aten._to_copy",
                         "aten.convolution_backward.0"):
            self.assertEqual([n for n in ops if left_out in n], [], left_out)

        # Hashed through the GPU library's path (each output copied where it is, at once): the
        # same records; and with module outputs at the same step, both.
        stand_in, _ = self._record_levels("ops-stand-in", ops="steps:1", stand_in=True)
        with open(os.path.join(path, "records.rpr"), "rb") as a, open(os.path.join(stand_in, "records.rpr"), "rb") as b:
            self.assertEqual(a.read(), b.read())
        both, hooks = self._record_levels("both", modules="first", ops="first", steps=1)
        self.assertEqual(hooks, [18])
        with Trace(both) as t:
            names = [x.name for x in next(iter(t.steps())).tensors]
        self.assertLess(names.index("block.0/aten.convolution#0"), names.index("block.0"))
        self.assertLess(names.index("shift/aten.add#0"), names.index("shift"))

    def test_two_runs_that_differ_in_one_op_diverge_first_at_that_aten_op(self):
        a, _ = self._record_levels("a", ops="first")
        b, _ = self._record_levels("b", ops="first", eps=1e-3)
        diff = repro("diff", a, b)
        self.assertEqual(diff.returncode, 1, diff.stdout + diff.stderr)
        self.assertIn("DIVERGED  first at step 0, tensor `shift/aten.add#0`", diff.stdout)

    def test_the_levels_are_taken_from_the_environment_and_one_that_is_no_step_policy_is_refused(self):
        from repro.torch import ModelRecorder
        from repro.trace import Trace
        from repro.writer import WriteError

        model = LevelsNet()
        path = os.path.join(self.dir, "asked")
        with mock.patch.dict(os.environ, {"REPRO_MODULES": "every:2", "REPRO_OPS": "steps:1,3"}):
            ModelRecorder.create_or_gated(path, {"workload": "asked"}, model, ops="all").finish()
        with Trace(path) as t:
            self.assertEqual((t.header["capture"]["modules"], t.header["capture"]["ops"]),
                             (("every", 2), ("steps", [1, 3])))
        for variable, value in (("REPRO_MODULES", "sometimes"), ("REPRO_OPS", "every:0")):
            with self.subTest(variable=variable), mock.patch.dict(os.environ, {variable: value}):
                with self.assertRaises(WriteError) as e:
                    ModelRecorder.create_or_gated(os.path.join(self.dir, "refused"), {"workload": "x"}, model)
                self.assertIn(f"{variable}={value}: expected a step policy, one of none, all, first, first-and-last, "
                              "every:N, steps:A,B,...", str(e.exception))
                self.assertFalse(os.path.exists(os.path.join(self.dir, "refused")))
        # As `repro record --modules P --ops P -- CMD` asks.
        program, out = write_named_program(os.path.join(self.dir, "program")), os.path.join(self.dir, "recorded")
        run = repro("record", "--out", out, "--modules", "every:2", "--ops", "first", "--", sys.executable, program,
                    env=program_env())
        self.assertEqual(run.returncode, 0, run.stdout + run.stderr)
        with Trace(out) as t:
            self.assertEqual((t.header["capture"]["modules"], t.header["capture"]["ops"]), (("every", 2), ("first",)))
            nodes = {s.step: [x.name for x in s.tensors if x.node is not None] for s in t.steps()}
        self.assertEqual((nodes[1], nodes[2]), (["loss"], ["encoder", "act", "decoder", "loss"]))
        self.assertIn("act/aten.tanh_backward#3", nodes[0])

    def test_the_same_program_run_from_two_directories_writes_identical_records(self):
        from repro.trace import Trace

        # A project's script, started from outside the project and from its own directory: the
        # sources name it from the project's root either way.
        project = os.path.join(self.dir, "project")
        program = write_named_program(os.path.join(project, "scripts"))
        open(os.path.join(project, "pyproject.toml"), "w").close()
        elsewhere = os.path.join(self.dir, "elsewhere")
        os.makedirs(elsewhere)
        records = []
        for name, cwd in (("outside", elsewhere), ("inside", os.path.dirname(program))):
            out = os.path.join(self.dir, name)
            run = subprocess.run([sys.executable, program, out], cwd=cwd, env=program_env(), capture_output=True,
                                 text=True)
            self.assertEqual(run.returncode, 0, run.stderr)
            with open(os.path.join(out, "records.rpr"), "rb") as f:
                records.append(f.read())
        self.assertEqual(records[0], records[1])
        line = 1 + next(i for i, text in enumerate(NAMED_PROGRAM.splitlines()) if "model(x)" in text)
        with Trace(os.path.join(self.dir, "inside")) as t:
            sources = {x.source for s in t.steps() for x in s.tensors if x.source is not None}
        self.assertEqual(sources, {f"scripts/train.py:{line}"})

    def test_every_run_setting_is_kept_in_the_header_and_one_it_cannot_keep_is_refused_by_name(self):
        from repro.torch import ModelRecorder
        from repro.trace import Trace
        from repro.writer import WriteError

        def record(name, run):
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
            path = os.path.join(self.dir, name)
            with mock.patch.dict(os.environ, {"REPRO_TRACE_DIR": "", "REPRO_PERTURB": ""}):
                rec = ModelRecorder.create_or_gated(path, run, model)
            train_three_steps(rec, model, torch.optim.SGD(model.parameters(), lr=0.1))
            rec.finish()
            return path

        settings = {"seed": 0, "batch": 32, "accum": 4, "bf16": True, "betas": (0.9, 0.999), "schedule": None}
        a = record("a", {"workload": "settings", "steps": 3, **settings, "params": {"lr": 0.1, "optimizer": "sgd"}})
        with Trace(a) as t:
            self.assertEqual(t.header["run"]["params"], {
                "accum": "4", "batch": "32", "betas": "[0.9,0.999]", "bf16": "true", "lr": "0.1",
                "optimizer": "sgd", "schedule": "null", "seed": "0"})
        b = record("b", {"workload": "settings", "steps": 3, **settings, "seed": 1,
                         "params": {"lr": 0.1, "optimizer": "sgd"}})
        diff = repro("diff", a, b)
        self.assertIn("config differs", diff.stdout, diff.stdout + diff.stderr)
        self.assertRegex(diff.stdout, r"(?m)^\s*seed: 0 \| 1$")
        # What a header cannot keep is refused before anything is written, naming its setting.
        for run, says in (({"workload": "w", "schedule": lambda step: 0.1}, "`schedule` is function"),
                          ({"workload": "w", "params": {"device": torch.device("cpu")}}, "`device` is device"),
                          ({"workload": "w", "seed": 0, "params": {"seed": 0}}, "`seed` is given twice")):
            with self.subTest(says=says):
                with self.assertRaisesRegex(WriteError, says):
                    record("refused", run)
                self.assertFalse(os.path.exists(os.path.join(self.dir, "refused")))

    def test_a_planted_fault_is_in_the_header_and_one_that_reaches_nothing_is_an_error_naming_what_it_can(self):
        from collections import OrderedDict

        from repro.torch import ModelRecorder, Perturbation, Recorder
        from repro.trace import Trace
        from repro.writer import WriteError

        def record(name, perturbation=None):
            torch.manual_seed(0)
            model = torch.nn.Sequential(OrderedDict(encoder=torch.nn.Linear(8, 16), act=torch.nn.Tanh(),
                                                    decoder=torch.nn.Linear(16, 2)))
            path = os.path.join(self.dir, name)
            recorder = Recorder(path, {"workload": "fault", "steps": 3}, modules="all",
                                perturbation=perturbation and Perturbation(perturbation))
            rec = ModelRecorder(recorder, model)
            train_three_steps(rec, model, torch.optim.SGD(model.parameters(), lr=0.1))
            rec.finish()
            return path

        clean, planted = record("clean"), record("planted", "1:encoder:1@3")
        with Trace(planted) as t:
            self.assertEqual(t.header["run"]["params"], {"perturb": "1:encoder:1@3"})
        diff = repro("diff", clean, planted)
        self.assertEqual(diff.returncode, 1, diff.stdout + diff.stderr)
        self.assertIn("config differs", diff.stdout)
        self.assertRegex(diff.stdout, r"(?m)^\s*perturb: \(unset\) \| 1:encoder:1@3$")
        # A misspelt module: an error once its step has passed, the closest names first.
        with self.assertRaises(WriteError) as e:
            record("misspelt", "1:encodr:1")
        self.assertIn("REPRO_PERTURB=1:encodr:1: the fault was planted nowhere: no tensor `encodr` passed through "
                      "the recorder at any step; the names it reaches, the closest first: `encoder`, ",
                      str(e.exception))
        self.assertIn("steps recorded: 0 to 1", str(e.exception))
        # A step past the end: an error when the recorder finishes, naming the steps recorded.
        with self.assertRaisesRegex(WriteError, "step 7 was never recorded; .*; steps recorded: 0 to 2"):
            record("late", "7:decoder:1")
        # A rank the run does not have: refused before anything is recorded.
        with mock.patch.dict(os.environ, {"REPRO_PERTURB": "1:encoder:1", "REPRO_PERTURB_RANK": "1"}):
            with self.assertRaisesRegex(WriteError, "REPRO_PERTURB_RANK=1: the run has rank 0 alone"):
                Recorder.create_or_gated(os.path.join(self.dir, "no-rank"), {"workload": "fault"}, place=None)

    def test_a_fault_that_reaches_nothing_fails_the_program_under_repro_s_commands(self):
        program = write_named_program(os.path.join(self.dir, "program"))
        gate = repro("gate", "--", sys.executable, program, env=program_env(REPRO_PERTURB="1:decodr:1"))
        self.assertNotEqual(gate.returncode, 0, gate.stdout + gate.stderr)
        self.assertNotIn("PASS", gate.stdout)
        self.assertIn("the names it reaches, the closest first: `decoder`", gate.stderr)
        out = os.path.join(self.dir, "late")
        run = repro("record", "--out", out, "--", sys.executable, program, env=program_env(REPRO_PERTURB="5:act:1"))
        self.assertNotEqual(run.returncode, 0, run.stdout + run.stderr)
        self.assertIn("REPRO_PERTURB=5:act:1: the fault was planted nowhere: step 5 was never recorded", run.stderr)

    def test_a_planted_fault_propagates_as_a_real_one(self):
        for device in ["cpu"] + (["cuda"] if torch.cuda.is_available() else []):
            with self.subTest(device=device):
                self._planted_and_real_fault(torch.device(device))

    def _planted_and_real_fault(self, device):
        from repro.torch import ModelRecorder, Perturbation, Recorder
        from repro.trace import Trace, read_tensor

        def run(name, perturbation=None, real_fault=False):
            """Three training steps of a small MLP; at step 1, element 3 of the first layer's
            output is 1 ULP higher: planted by REPRO_PERTURB, or by the program's own code (a
            hook that adds the difference, through which gradients flow)."""
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)).to(device)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            at = {"step": 0}
            if real_fault:
                def fault(module, args, out):
                    if at["step"] != 1:
                        return None
                    flat = out.detach().reshape(-1)
                    delta = torch.zeros_like(flat)
                    delta[3] = torch.nextafter(flat[3], torch.full_like(flat[3], float("inf"))) - flat[3]
                    return out + delta.reshape(out.shape)

                model[0].register_forward_hook(fault)  # before the recorder's: it records the moved output
            path = os.path.join(self.dir, f"{name}-{device.type}")
            rec = ModelRecorder(Recorder(path, {"workload": "fault", "steps": 3}, capture="all", modules="all", device=device,
                                         perturbation=perturbation, device_hashing=False), model)
            data = torch.Generator().manual_seed(1)
            for step in range(3):
                at["step"] = step
                x = torch.rand(8, 4, generator=data).to(device)
                opt.zero_grad()
                with rec.training_step(step, inputs={"x": x}) as s:
                    loss = model(x).square().mean()
                    s.loss(loss)
                    loss.backward()
                    s.gradients()
                    opt.step()
            rec.finish()
            return path

        clean, planted, real = run("clean"), run("planted", Perturbation("1:0:1@3")), run("real", real_fault=True)

        def hashes(path):
            with Trace(path) as t:
                return {(s.step, x.name): x.hash for s in t.steps() for x in s.tensors}

        # Every tensor of every step, gradients included, as the real fault left it (replacing
        # the element cut its gradient: `0.weight.grad` differed).
        self.assertEqual(hashes(planted), hashes(real))
        # One element 1 ULP up, every other one bit for bit; and the gradients follow from it.
        p, c = (read_tensor(path, 1, "0").reshape(-1) for path in (planted, clean))
        self.assertEqual(p[3], np.nextafter(c[3], np.float32(np.inf)))
        self.assertEqual(np.delete(p, 3).tobytes(), np.delete(c, 3).tobytes())
        grads = [read_tensor(path, 1, "0.weight.grad") for path in (planted, clean)]
        self.assertFalse(np.array_equal(*grads))

    def _record_in_place_model(self, path, flush=None, stand_in=True, steps=4, changes_late=False,
                               data_hash=None, fails_at=None, copy_limit=None):
        """Records `InPlaceModel` (below) for `steps` steps, hashing through the CPU stand-in of
        the GPU library under the flush mode `flush` (or on the host), copying outputs changed in
        place of at most `copy_limit` bytes at their hooks (None: the default), with `data_hash`
        (None: `blake3`); step
        `fails_at` raises after its forward pass (and is left out of the trace). Returns the
        stand-in and the model."""
        from repro.torch import ModelRecorder, Recorder

        torch.manual_seed(0)
        model = InPlaceModel()
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        from repro.torch.options import FlushOptions

        options = FlushOptions(**{"mode": flush} if flush else {})
        if copy_limit is not None:
            options = dataclasses.replace(options, copy_at_hook_max_bytes=copy_limit)
        recorder = Recorder(path, {"workload": "in-place", "steps": steps}, capture="none", modules="all",
                            data_hash=data_hash, flush=options)
        library = hash_on_cpu_stand_in(recorder) if stand_in else None
        rec = ModelRecorder(recorder, model)
        g = torch.Generator().manual_seed(1)
        try:
            for step in range(steps):
                model.changes_late = changes_late and step > 0
                x = torch.randn(16, 32, generator=g)
                if step == fails_at:
                    with self.assertRaises(ArithmeticError):
                        with rec.training_step(step, inputs={"x": x}):
                            model(x)
                            raise ArithmeticError("a step that fails after its forward pass")
                    continue
                with rec.training_step(step, inputs={"x": x}) as s:
                    loss = model(x).square().mean()
                    s.loss(loss)
                    loss.backward()
                    s.gradients()
                    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)  # the gradients, in place
                    opt.step()
                opt.zero_grad(set_to_none=False)  # and again, zeroed in place
        finally:
            rec.finish()
        return library, model

    def test_every_flush_policy_hashes_as_the_host_does(self):
        host = os.path.join(self.dir, "host")
        self._record_in_place_model(host, stand_in=False)
        with open(os.path.join(host, "records.rpr"), "rb") as f:
            expected = f.read()
        flushes = {}
        for flush in ("module", "batched"):
            path = os.path.join(self.dir, flush)
            library, _ = self._record_in_place_model(path, flush)
            flushes[flush] = library.flushes
            with open(os.path.join(path, "records.rpr"), "rb") as f:
                self.assertEqual(f.read(), expected, f"REPRO_TORCH_FLUSH={flush}: a hash is not the host's")
        # After the first step, the outputs left alone are read together: far fewer flushes.
        self.assertLessEqual(flushes["batched"], flushes["module"] / 2)

    def test_under_xxh3_1k_outputs_changed_in_place_are_read_at_once_not_copied_and_hash_as_the_host_does(self):
        host = os.path.join(self.dir, "host")
        self._record_in_place_model(host, stand_in=False, data_hash="xxh3-1k", steps=5, fails_at=2)
        with open(os.path.join(host, "records.rpr"), "rb") as f:
            expected = f.read()
        for flush in ("batched", "module"):
            path = os.path.join(self.dir, flush)
            # A step that fails leaves what was read at once, and what was pushed before it, behind.
            library, _ = self._record_in_place_model(path, flush, data_hash="xxh3-1k", steps=5, fails_at=2)
            with open(os.path.join(path, "records.rpr"), "rb") as f:
                self.assertEqual(f.read(), expected, f"REPRO_TORCH_FLUSH={flush}: a hash is not the host's")
            # The outputs changed in place (two a step, the steps after the first) were read at
            # once, never copied.
            self.assertGreaterEqual(library.read_now, 2 * 3, flush)
        # Under blake3 the library cannot read at once: they are copied, as before.
        library, _ = self._record_in_place_model(os.path.join(self.dir, "blake3"), "batched")
        self.assertEqual(library.read_now, 0)

    def test_an_output_changed_in_place_too_large_to_copy_is_read_at_its_hook_without_a_flush_under_xxh3_1k(self):
        # An output the program changes in place next, over the copy's limit, is read at its
        # hook: under xxh3-1k by the leaf pass there (no flush), under blake3 by a flush of
        # everything queued. With the limit at 0 every such output is one; the records must be
        # the host's either way.
        from repro.torch.options import FlushOptions

        default_limit = FlushOptions().copy_at_hook_max_bytes
        for data_hash in ("xxh3-1k", "blake3"):
            host = os.path.join(self.dir, f"host-{data_hash}")
            self._record_in_place_model(host, stand_in=False, data_hash=data_hash)
            with open(os.path.join(host, "records.rpr"), "rb") as f:
                expected = f.read()
            calls = {}
            for limit in (default_limit, 0):
                path = os.path.join(self.dir, f"{data_hash}-{limit}")
                library, _ = self._record_in_place_model(path, "batched", data_hash=data_hash, copy_limit=limit)
                with open(os.path.join(path, "records.rpr"), "rb") as f:
                    self.assertEqual(f.read(), expected, f"{data_hash}, limit {limit}: a hash is not the host's")
                calls[limit] = (library.flushes, library.read_now)
            if data_hash == "xxh3-1k":
                self.assertEqual(calls[0], calls[default_limit])
            else:
                self.assertGreater(calls[0][0], calls[default_limit][0])

    def test_an_output_changed_in_place_only_after_the_first_step_is_refused_not_hashed_wrong(self):
        from repro.writer import WriteError

        for flush in ("batched",):
            with self.assertRaises(WriteError) as caught:
                self._record_in_place_model(os.path.join(self.dir, flush), flush, changes_late=True)
            self.assertIn("`late` changed in place", str(caught.exception))
            self.assertIn("REPRO_TORCH_FLUSH=module", str(caught.exception))
        host, module = os.path.join(self.dir, "host"), os.path.join(self.dir, "module")
        self._record_in_place_model(host, stand_in=False, changes_late=True)
        self._record_in_place_model(module, "module", changes_late=True)
        with open(os.path.join(host, "records.rpr"), "rb") as a, open(os.path.join(module, "records.rpr"), "rb") as b:
            self.assertEqual(a.read(), b.read())

    def test_a_parameter_unchanged_since_its_update_is_hashed_once(self):
        path = os.path.join(self.dir, "t")
        library, model = self._record_in_place_model(path, "batched", steps=3)
        from repro.trace import Trace

        with Trace(path) as t:
            steps = list(t.steps())
        updated = {r.name: r for r in steps[0].tensors if r.name.endswith(".updated")}
        weights = {r.name: r for r in steps[1].tensors if r.kind == "weight" and r.phase == "forward"}
        self.assertEqual(len(weights), len(list(model.parameters())))
        for name, record in weights.items():
            self.assertEqual(record.hash, updated[f"{name}.updated"].hash, name)
        # Hashed once each: the first step's parameters and each step's updates (3 steps); the
        # later steps' parameters are the updates before them.
        for name, p in model.named_parameters():
            self.assertEqual(library.reads[p.data_ptr()], 4, name)

    def test_parameters_queued_together_hash_as_the_host_does_when_they_move_change_layout_or_lose_gradients(self):
        from repro.torch import DeviceHasher, ModelRecorder, Recorder, recorder

        def record(path, stand_in):
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(12, 24), torch.nn.Tanh(), torch.nn.Linear(24, 4),
                                        torch.nn.Linear(4, 4))
            model[2].requires_grad_(False)  # frozen: its update repeats its record at the step's start
            opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.05, momentum=0.9)
            recorder = Recorder(path, {"workload": "moves", "steps": 8}, capture="none")
            if stand_in:
                hash_on_cpu_stand_in(recorder)
            rec = ModelRecorder(recorder, model)
            first = model[0]
            g = torch.Generator().manual_seed(1)
            for step in range(8):
                with torch.no_grad():
                    if step == 3:  # a parameter's memory replaced: at another address
                        first.weight.data = first.weight.data.clone()
                    if step == 4:  # one laid out column-major: not contiguous
                        first.weight.data = first.weight.data.t().contiguous().t()
                    if step == 5:  # and contiguous again
                        first.weight.data = first.weight.data.contiguous()
                x = torch.randn(8, 12, generator=g)
                with rec.training_step(step, inputs={"x": x}) as s:
                    # At step 5 the last layer is left out: its parameters get no gradient.
                    loss = (model[:3] if step == 5 else model)(x).square().mean()
                    s.loss(loss)
                    loss.backward()
                    s.gradients()
                    opt.step()
                opt.zero_grad(set_to_none=step % 2 == 0)  # gradients freed (at new addresses), or zeroed
            rec.finish()

        host, gpu = os.path.join(self.dir, "host"), os.path.join(self.dir, "gpu")
        record(host, stand_in=False)
        one_by_one = []  # (step, records) of each group queued a tensor at a time

        def each(step_recorder, fields, tensors, *args, **kwargs):
            if len(fields) > 1:
                one_by_one.append((step_recorder.step, len(fields)))
            return queue_each(step_recorder, fields, tensors, *args, **kwargs)

        queue_each = recorder.StepRecorder._queue_each
        with mock.patch.object(DeviceHasher, "queue_many", autospec=True, side_effect=DeviceHasher.queue_many) as together, \
                mock.patch.object(recorder.StepRecorder, "_queue_each", each):
            record(gpu, stand_in=True)
        # The groups were queued together where nothing changed but the values and addresses
        # (steps 1, 2, 3, 6 and 7), frozen parameters and the gradients of the others among
        # them; one by one where a group is first seen (steps 0 and 5, whose gradients are
        # fewer) or a parameter is not contiguous (4, and the parameters again at 5); and every
        # record, at every step, is the host's.
        self.assertEqual(sorted({step for step, _ in one_by_one}), [0, 4, 5])
        self.assertGreaterEqual(together.call_count, 12)
        with open(os.path.join(host, "records.rpr"), "rb") as a, open(os.path.join(gpu, "records.rpr"), "rb") as b:
            self.assertEqual(a.read(), b.read())
        from repro.trace import Trace

        with Trace(gpu) as t:
            steps = list(t.steps())
        self.assertEqual(steps[5].no_gradient, ["3.bias", "3.weight"])

    def test_a_full_value_step_is_written_beside_the_program_and_its_failure_stops_the_next(self):
        import threading

        from repro.torch import ModelRecorder, Recorder, recorder
        from repro.trace import Trace
        from repro.writer import TraceWriter, WriteError

        path = os.path.join(self.dir, "t")
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        written, original = {}, TraceWriter.write_laid_out

        def write(writer, step, *rest):
            written[step] = threading.current_thread().name
            if step == 2:
                raise OSError(28, "the disk is full (planted)")
            return original(writer, step, *rest)

        rec = ModelRecorder(Recorder(path, {"workload": "full", "steps": 4}, capture="steps:0,2", inline_max_bytes=8,
                                    place=None), model)
        # Beside the program from the first byte (the threshold spares small steps the thread).
        with mock.patch.object(TraceWriter, "write_laid_out", write), mock.patch.object(recorder,
                                                                                      "WRITE_BESIDE_MIN_BYTES", 1):
            for step in range(3):
                with rec.training_step(step, inputs={"x": torch.ones(3, 4)}) as s:
                    loss = model(torch.ones(3, 4)).sum()
                    s.loss(loss)
                    loss.backward()
                    s.gradients()
                    opt.step()
                opt.zero_grad()
            with self.assertRaises(WriteError) as caught, rec.training_step(3) as s:
                s.loss(model(torch.ones(3, 4)).sum())
            self.assertIn(f"{path}: step 2, written beside the program, was not written: [Errno 28] the disk is full "
                          "(planted)", str(caught.exception))
            self.assertEqual(rec.finish(), 2)
        # Steps that keep values are written on the writer's thread, the others where they end.
        self.assertTrue(written[0].startswith("repro-writer"), written)
        self.assertEqual(written[1], threading.current_thread().name)
        self.assertTrue(written[2].startswith("repro-writer"), written)
        with Trace(path) as t:
            steps = list(t.steps())
        self.assertEqual([x.step for x in steps], [0, 1])
        self.assertTrue(os.path.isfile(os.path.join(path, "tensors", "step-00000000.safetensors")))
        run = repro("inspect", path, "--verify")
        self.assertEqual(run.returncode, 0, run.stdout + run.stderr)

    def test_the_data_hash_repro_asks_for_is_recorded_and_hashes_as_the_specification_says(self):
        from repro.torch import ModelRecorder, Recorder
        from repro.trace import Trace
        from repro.writer import WriteError

        def record(path, **options):
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(40, 30), torch.nn.Tanh(), torch.nn.Linear(30, 5))
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            rec = ModelRecorder(Recorder.create_or_gated(path, {"workload": "xxh3", "steps": 2}, **options), model)
            for step in range(2):
                x = torch.randn(6, 40)
                with rec.training_step(step, inputs={"x": x}) as s:
                    loss = model(x).square().mean()
                    s.loss(loss)
                    loss.backward()
                    s.gradients()
                    opt.step()
                opt.zero_grad()
            rec.finish()

        # As `repro record --data-hash xxh3-1k` runs the program: the variable wins over the
        # program's own choice, as REPRO_CAPTURE does.
        path = os.path.join(self.dir, "asked")
        with mock.patch.dict(os.environ, {"REPRO_DATA_HASH": "xxh3-1k"}):
            record(path, capture="all", data_hash="blake3")
        with Trace(path) as t:
            self.assertEqual((t.version, t.data_hash), ((2, 1), "xxh3-1k"))
            checked = []
            for s in t.steps():
                for x in s.tensors:
                    data = t.values(s, x)  # every value stored (capture all)
                    self.assertEqual(x.hash, tensor_hash(x.dtype, x.shape, data, "xxh3-1k"), f"step {s.step}, {x.name}")
                    checked.append(len(data))
        # Tensors of less than a chunk, of several, and of several and a part (4800 bytes).
        self.assertTrue(min(checked) < 1024 and max(checked) > 4096 and any(n % 1024 for n in checked if n > 1024))
        run = repro("inspect", path, "--verify")
        self.assertEqual(run.returncode, 0, run.stdout + run.stderr)
        # Without the variable, BLAKE3's trace as before; a constructor's argument wins over it;
        # a value that is no data hash is refused, naming the variable.
        record(os.path.join(self.dir, "default"), capture="none")
        with mock.patch.dict(os.environ, {"REPRO_DATA_HASH": "xxh3-1k"}):
            named = Recorder(os.path.join(self.dir, "named"), {"workload": "x"}, data_hash="blake3")
            named.finish()
        for plain in ("default", "named"):
            with Trace(os.path.join(self.dir, plain)) as t:
                self.assertEqual((t.version, t.data_hash), ((1, 10), "blake3"))
        with mock.patch.dict(os.environ, {"REPRO_DATA_HASH": "xxh3"}):
            with self.assertRaisesRegex(WriteError, "REPRO_DATA_HASH=xxh3: expected one of blake3, xxh3-1k"):
                Recorder.create_or_gated(os.path.join(self.dir, "bad"), {"workload": "x"})
        with self.assertRaisesRegex(WriteError, "data_hash='xxh3': expected one of blake3, xxh3-1k"):
            Recorder(os.path.join(self.dir, "bad"), {"workload": "x"}, data_hash="xxh3")
        self.assertFalse(os.path.exists(os.path.join(self.dir, "bad")))

    def test_the_gpu_library_hashes_with_the_trace_s_data_hash_and_an_older_one_is_refused(self):
        from types import SimpleNamespace

        from repro.torch import DeviceHasher
        from repro.trace import Trace
        from repro.writer import WriteError

        paths = {side: os.path.join(self.dir, side) for side in ("host", "library")}
        self._record_in_place_model(paths["host"], stand_in=False, data_hash="xxh3-1k")
        library, _ = self._record_in_place_model(paths["library"], "batched", data_hash="xxh3-1k")
        self.assertGreater(len(library.reads), 0)
        with Trace(paths["library"]) as t:
            self.assertEqual(t.data_hash, "xxh3-1k")
        with open(os.path.join(paths["host"], "records.rpr"), "rb") as a, \
                open(os.path.join(paths["library"], "records.rpr"), "rb") as b:
            self.assertEqual(a.read(), b.read(), "a hash of the library is not the host's")
        # A library built before the data hash had a choice: BLAKE3 as before, xxh3-1k refused.
        older = SimpleNamespace(repro_cuda_hasher_new=lambda index: 1, repro_cuda_hasher_free=lambda handle: None)
        self.assertEqual(DeviceHasher("old.so", 0, lib=older).data_hash, "blake3")
        with self.assertRaises(WriteError) as e:
            DeviceHasher("old.so", 0, lib=older, data_hash="xxh3-1k")
        self.assertIn("old.so is older than the data hash xxh3-1k needs", str(e.exception))
        self.assertIn("rebuild it with `make cuda`", str(e.exception))

    def test_the_library_s_cpu_build_leaves_the_hashing_to_the_host(self):
        # The workspace's CPU build of repro's library (`cargo build --release -p
        # repro-cuda-hash`) has the records' packing and no GPU hashing: a recorder that finds it
        # hashes on the host, writes what it writes without it, and refuses device_hashing=True,
        # naming it. (On the host every record holds its bytes: the writer packs them itself.)
        from repro.torch import ModelRecorder, Recorder
        from repro.writer import WriteError

        library = os.path.abspath(os.path.join("target", "release", "librepro_cuda_hash.so"))
        self.assertTrue(os.path.isfile(library), f"no CPU build of the library at {library}: build it with "
                        "`cargo build --release -p repro-cuda-hash` (scripts/python-torch-check.sh does)")
        traces = []
        for found in (False, True):
            path = os.path.join(self.dir, f"library-{found}")
            env = {"REPRO_CUDA_HASH_LIB": library} if found else {}
            with mock.patch.dict(os.environ, env):
                torch.manual_seed(0)
                model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
                opt = torch.optim.SGD(model.parameters(), lr=0.1)
                recorder = Recorder(path, {"workload": "library"}, capture="none")
                self.assertFalse(recorder.hashes_on_gpu)
                rec = ModelRecorder(recorder, model)
                train_three_steps(rec, model, opt)
                rec.finish()
                if found:
                    with self.assertRaises(WriteError) as e:
                        Recorder(os.path.join(self.dir, "refused"), {"workload": "x"}, device_hashing=True)
                    self.assertIn(f"({library} was built without its GPU half)", str(e.exception))
                    # Refused before anything was written: nothing stands in the next try's way.
                    self.assertFalse(os.path.exists(os.path.join(self.dir, "refused")))
            traces.append(path)
        with open(os.path.join(traces[0], "records.rpr"), "rb") as a, \
                open(os.path.join(traces[1], "records.rpr"), "rb") as b:
            self.assertEqual(a.read(), b.read())

    def test_an_unknown_flush_policy_is_refused(self):
        from repro.torch import Recorder
        from repro.writer import WriteError

        from repro.torch.options import FlushOptions

        with mock.patch.dict(os.environ, {"REPRO_TORCH_FLUSH": "sometimes"}):
            with self.assertRaisesRegex(WriteError, "REPRO_TORCH_FLUSH=sometimes: expected one of batched, module"):
                Recorder.create_or_gated(os.path.join(self.dir, "t"), {"workload": "x", "steps": 1})
        with self.assertRaisesRegex(WriteError, "flush mode 'sometimes': expected one of batched, module"):
            Recorder(os.path.join(self.dir, "t"), {"workload": "x", "steps": 1}, flush=FlushOptions(mode="sometimes"))
        self.assertFalse(os.path.exists(os.path.join(self.dir, "t")))

    @unittest.skipUnless(torch and torch.cuda.is_available(), "no CUDA GPU")
    def test_tensors_hashed_on_the_gpu_hash_as_on_the_host(self):
        from repro.torch import ModelRecorder, Recorder, cuda_hash_library_path
        from repro.torch.options import FlushOptions, RecordOptions
        from repro.trace import Trace

        if cuda_hash_library_path() is None:
            self.skipTest("repro's GPU hashing library is not built (make cuda; REPRO_CUDA_HASH_LIB)")
        nn = torch.nn

        class Views(nn.Module):
            """Outputs the GPU kernels read as a PyTorch program makes them: a transposed
            (non-contiguous) view, bf16, bool, a scalar and an empty tensor."""

            def forward(self, h):
                return h.t(), h.to(torch.bfloat16), h > 0, h.sum(), h[:0]

        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                # The ReLU changes the first layer's output in place after its hook has read it;
                # `body`'s output is its last layer's (one hash for both).
                self.body = nn.Sequential(nn.Linear(64, 4096), nn.ReLU(inplace=True), nn.Linear(4096, 300))
                # Residual sums and ReLUs in place (after the first step, read at their hooks).
                self.blocks = nn.Sequential(InPlaceBlock(300), InPlaceBlock(300))
                self.views = Views()

            def forward(self, x):
                h = self.blocks(self.body(x))
                t, b, m, total, _ = self.views(h)
                return total + t.float().mean() + b.float().mean() + m.float().mean()

        traces = []
        # On the host; on the GPU under each flush policy; and on the GPU from a stream of the
        # program's own (which the recorder synchronizes around each launch).
        runs = [(False, False, "module")] + [(True, False, flush) for flush in ("module", "batched")]
        for on_gpu, side_stream, flush in runs + [(True, True, "batched")]:
            side = torch.cuda.Stream() if side_stream else None
            torch.manual_seed(0)
            model = Model().cuda()
            opt = torch.optim.SGD(model.parameters(), lr=0.01)
            path = os.path.join(self.dir, f"gpu-{on_gpu}-{side_stream}-{flush}")
            recorder = Recorder(path, {"workload": "views", "steps": 4}, capture="none", modules="all",
                                device=torch.device("cuda"), device_hashing=on_gpu,
                                options=RecordOptions(flush=FlushOptions(mode=flush)))
            rec = ModelRecorder(recorder, model)
            self.assertEqual(rec.recorder.hashes_on_gpu, on_gpu)
            g = torch.Generator(device="cuda").manual_seed(1)
            for step in range(4):
                with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
                    self._step(rec, model, opt, g, step)
            rec.finish()
            traces.append(path)
        # Run under REPRO_DATA_HASH=xxh3-1k on a GPU machine, this checks the GPU's xxh3-1k too.
        with Trace(traces[0]) as t:
            self.assertEqual(t.data_hash, os.environ.get("REPRO_DATA_HASH") or "blake3")
        for other in traces[1:]:
            diff = repro("diff", traces[0], other)
            self.assertEqual(diff.returncode, 0, diff.stdout + diff.stderr)
            self.assertIn("IDENTICAL", diff.stdout)
            with open(os.path.join(traces[0], "records.rpr"), "rb") as a, open(os.path.join(other, "records.rpr"), "rb") as b:
                self.assertEqual(a.read(), b.read(), f"{other}: a GPU hash, or an inline value, is not the host's")

    def _step(self, rec, model, opt, g, step):
        """One step of the GPU test's training; the third fails, and is left out of the trace."""
        x = torch.randn(32, 64, device="cuda", generator=g)
        if step == 2:
            with self.assertRaises(RuntimeError):
                with rec.training_step(step, inputs={"x": x}):
                    model(x)
                    raise RuntimeError("a step that fails")
            return
        with rec.training_step(step, inputs={"x": x}) as s:
            loss = model(x)
            s.loss(loss)
            loss.backward()
            s.gradients()
            opt.step()
            opt.zero_grad()

if torch is not None:

    class InPlaceBlock(torch.nn.Module):
        """A residual block that adds its input to its layer's output in place, then applies an
        in-place ReLU to the sum."""

        def __init__(self, width):
            super().__init__()
            self.layer = torch.nn.Linear(width, width)
            self.relu = torch.nn.ReLU(inplace=True)

        def forward(self, h):
            out = self.layer(h)
            out += h
            return self.relu(out)

    class InPlaceModel(torch.nn.Module):
        """Outputs changed in place in every position a hook can see: by the next module (an
        in-place ReLU), by the parent's code (a residual sum), a container's output changed by
        its parent; and `late`, changed in place by the parent's code only when `changes_late`."""

        def __init__(self):
            super().__init__()
            self.body = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(inplace=True), torch.nn.Linear(64, 48))
            self.blocks = torch.nn.Sequential(InPlaceBlock(48), InPlaceBlock(48), torch.nn.Linear(48, 48))
            self.late = torch.nn.Linear(48, 48)
            layers = [m for _ in range(5) for m in (torch.nn.Linear(48, 48), torch.nn.Tanh())]
            self.head = torch.nn.Sequential(*layers, torch.nn.Linear(48, 8))  # nothing in place
            self.changes_late = False

        def forward(self, x):
            h = self.blocks(self.body(x))
            h.mul_(0.5)  # the container's output (its last layer's) changed by its parent
            z = self.late(h)
            if self.changes_late:
                z.add_(1.0)
            return self.head(z)


    class Shift(torch.nn.Module):
        """Adds `eps` to its input: one aten op (`aten.add`), whatever `eps` is."""

        def __init__(self, eps):
            super().__init__()
            self.eps = eps

        def forward(self, h):
            return h + self.eps

    class LevelsNet(torch.nn.Module):
        """A convolution, a batch norm and an in-place ReLU in a `Sequential`, a `Shift` by `eps`
        and a linear head, each called on a line of its own."""

        def __init__(self, eps=0.0):
            super().__init__()
            self.block = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.BatchNorm2d(4),
                                             torch.nn.ReLU(inplace=True))
            self.shift = Shift(eps)
            self.head = torch.nn.Linear(4 * 4 * 4, 3)

        def forward(self, x):
            h = self.block(x)
            h = self.shift(h)
            return self.head(h.flatten(1))


if __name__ == "__main__":
    unittest.main()
