"""A training step as the bench scripts here run it, plain or recorded by repro.torch, and the
report of their step times: one definition for every script (they import it from beside them)."""

import statistics
import sys
from typing import Optional


def training_step(model, opt, loss_of, rec=None, step: int = 0, inputs: Optional[dict] = None) -> None:
    """One step: `loss_of(model)`, its backward pass and `opt.step()`; recorded by `rec` (a
    `repro.torch.ModelRecorder`: `inputs`, the parameters, the loss, the gradients and the
    updates, and every module's output or op's where its levels say) as step `step`, or plain
    when `rec` is None."""
    opt.zero_grad()
    if rec is None:
        loss_of(model).backward()
        opt.step()
        return
    with rec.training_step(step, inputs=inputs) as s:
        loss = loss_of(model)
        s.loss(loss)
        loss.backward()
        s.gradients()
        opt.step()


def report_step_times(rec, rank: int, times: list, what: str) -> None:
    """Finishes `rec`'s trace, if recording, and prints from rank 0 the median of the step times
    (seconds) after the first two, naming the run as `what`."""
    if rec is not None:
        rec.finish()
    if rank == 0:
        label = "plain" if rec is None else "recorded"
        print(f"{label} step: median {statistics.median(times[2:]) * 1e3:.1f} ms over steps 2 to {len(times) - 1} "
              f"({what})", file=sys.stderr)
