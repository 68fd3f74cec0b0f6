"""Training programs the tests run under repro's commands: the training loop the small test
programs share (`TRAINING_LOOP`), and a program recorded by `repro record -- python PROGRAM`
and checked as the one-line integrations' tests check it (`test_trainer.py`,
`test_lightning.py`): two same-seed runs IDENTICAL, the records a step must hold, a fault
planted at step 1 found at step 1."""

import os
import subprocess
import sys
import tempfile

# The test programs' training loop over `steps` steps of `model`, `opt` and `rec`, recording
# each; `each_step`: lines that open each step.
TRAINING_LOOP = """\
data = torch.Generator().manual_seed(1)
for step in range({steps}):
{each_step}    x = torch.rand(8, 4, generator=data)
    opt.zero_grad()
    with rec.training_step(step, inputs={{"x": x}}) as s:
        loss = model(x).square().mean()
        s.loss(loss)
        loss.backward()
        s.gradients()
        opt.step()
rec.finish()
"""

REPRO = os.environ.get("REPRO_BIN", "target/release/repro")
PYTHON = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def example(name: str) -> str:
    """The text of the program python/examples/`name`."""
    with open(os.path.join(PYTHON, "examples", name)) as f:
        return f.read()


def record(case, tmp: str, program_text: str, name: str, launcher=(sys.executable,), **env) -> str:
    """`repro record -- python PROGRAM` into `tmp/name` (the program's arguments: a path the
    repro command's REPRO_TRACE_DIR overrides, and a scratch folder for the trainer), with
    `env` added; the trace. `launcher`: what runs the program (python, or `torchrun(N)`).
    `case`: the test case that asserts it succeeded."""
    program = os.path.join(tmp, "train.py")
    with open(program, "w") as f:
        f.write(program_text)
    out = os.path.join(tmp, name)
    run = subprocess.run([REPRO, "record", "--out", out, "--", *launcher, program, os.path.join(tmp, "unused"),
                          os.path.join(tmp, f"scratch-{name}")], capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=PYTHON, **env))
    case.assertEqual(run.returncode, 0, run.stdout + run.stderr[-3000:])
    return out


def torchrun(ranks: int) -> tuple:
    """The launcher of `ranks` processes of a program on this host (torch.distributed.run)."""
    return (sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}")


def check_one_line_callback(case, program_text: str, names: tuple, module: str, fault: str) -> None:
    """Records `program_text` twice and once with `fault` (REPRO_PERTURB, at step 1): the first
    step holds `names`, `module`'s output only at the first step (the default `modules` level),
    the same-seed runs are IDENTICAL, and the faulty run diverges first at step 1's loss with
    the fault named."""
    sys.path.insert(0, PYTHON)
    from repro.trace import Trace

    with tempfile.TemporaryDirectory() as tmp:
        a, b = record(case, tmp, program_text, "a"), record(case, tmp, program_text, "b")
        with Trace(a) as trace:
            steps = list(trace.steps())
            case.assertTrue(trace.complete)
        case.assertEqual([s.step for s in steps], [0, 1, 2])
        recorded = [t.name for t in steps[0].tensors]
        for name in names:
            case.assertIn(name, recorded)
        case.assertNotIn(module, [t.name for t in steps[1].tensors])
        diff = subprocess.run([REPRO, "diff", a, b], capture_output=True, text=True)
        case.assertEqual(diff.returncode, 0, diff.stdout + diff.stderr)
        case.assertIn("IDENTICAL", diff.stdout)

        faulty = record(case, tmp, program_text, "faulty", REPRO_PERTURB=fault)
        diff = subprocess.run([REPRO, "diff", a, faulty], capture_output=True, text=True)
        case.assertEqual(diff.returncode, 1, diff.stdout + diff.stderr)
        case.assertIn("DIVERGED  first at step 1, tensor `loss` (loss)", diff.stdout)
        case.assertIn(f"planted fault (perturb: (unset) in A, {fault} in B)", diff.stdout)
