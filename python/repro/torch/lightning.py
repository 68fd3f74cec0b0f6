"""Recording a Lightning `Trainer`'s training with one line: `ReproCallback`.

    trainer = lightning.Trainer(max_steps=100, callbacks=[ReproCallback("runs/a")])

Each optimizer step is one recorded step, numbered as the Trainer's `global_step` counts them
(from 0): the parameters and buffers at its start, the batch of each micro-batch (its tensors by
their place in it, `batch.0`, `batch.x`, ...: `batch.0#1` for the second micro-batch of an
accumulated step), the loss `training_step` returns (`loss`, `loss#1`, ...), every module's
output at the steps the `modules` level names, the gradients as the optimizer receives them
(`on_before_optimizer_step`: after the backward passes, before clipping, which Lightning applies
inside the optimizer step), the updated parameters and the optimizer's state after its step. Validation runs unrecorded. Under `repro
record -- python train.py` (or `gate`, `bisect`) the repro command's settings win, as
`ModelRecorder.create_or_gated` reads them. The trace is finished when training ends.
"""

from __future__ import annotations

from typing import Optional

import torch
from lightning.pytorch.callbacks import Callback

from .model import CapturedStep, ModelRecorder, _tensors_of


class ReproCallback(Callback):
    """Records a Lightning `Trainer`'s optimizer steps into a repro trace (see the module)."""

    def __init__(self, path: str = "runs/lightning", run: Optional[dict] = None, **options):
        """`path`: where the trace goes, unless a repro command says otherwise. `run`: the run
        settings for the header (default: the module's class, `max_steps` and the gradient
        accumulation). `options`: as `ModelRecorder.create_or_gated` takes them."""
        self.path, self.run, self.options = path, run, options
        self.recorder: Optional[ModelRecorder] = None
        self._step = None  # the open `training_step` block
        self._captured: Optional[CapturedStep] = None
        self._calls = 0  # micro-batches in this step
        self._stepped = False  # whether the optimizer stepped in this micro-batch

    def on_train_start(self, trainer, pl_module):
        run = self.run if self.run is not None else {
            "workload": type(pl_module).__name__,
            "steps": trainer.max_steps,
            "accum": trainer.accumulate_grad_batches,
        }
        optimizers = trainer.optimizers
        self.recorder = ModelRecorder.create_or_gated(self.path, run, pl_module,
                                                      optimizer=optimizers[0] if len(optimizers) == 1 else None,
                                                      **self.options)

    def _name(self, name: str) -> str:
        return name if self._calls == 0 else f"{name}#{self._calls}"

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self._step is None:
            self._step = self.recorder.training_step(trainer.global_step)
            self._captured = self._step.__enter__()
            self._calls = 0
        for key, value in _tensors_of(batch, "batch."):
            self._captured.step.queue(self._name(key), value, "input")

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        if self._captured is not None:
            self._captured.gradients()
            self._stepped = True

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if self._captured is None:
            return
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if isinstance(loss, torch.Tensor):
            self._captured.loss(loss, self._name("loss"))
        self._calls += 1
        if self._stepped:  # the optimizer stepped: the step's updates, and the step is over
            step, self._step, self._captured, self._stepped = self._step, None, None, False
            step.__exit__(None, None, None)

    def on_train_end(self, trainer, pl_module):
        if self._step is not None:  # a step the optimizer never finished: not written
            step, self._step, self._captured = self._step, None, None
            step.__exit__(RuntimeError, RuntimeError("training ended inside an accumulation window"), None)
        if self.recorder is not None and not self.recorder.recorder.finished:
            self.recorder.finish()
