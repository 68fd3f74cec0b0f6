"""Recording a transformers `Trainer`'s training with one line: `ReproCallback`.

    trainer = Trainer(model, args, train_dataset=data, callbacks=[ReproCallback("runs/a")])

Each optimizer step is one recorded step, numbered as the Trainer's `global_step` counts them
(from 0): the parameters and buffers at its start, the batch the model is called with (its
tensor arguments, `input_ids`, `labels`, ...: `input_ids#1` for the second micro-batch of an
accumulated step), the loss the model returns (`loss`, `loss#1`, ...), every module's output at
the steps the `modules` level names, the gradients as the optimizer receives them (after the
Trainer clips them: `on_pre_optimizer_step`), the updated parameters and the optimizer's state
after its step (Adam's moments, the learning rate applied: kind `optimizer_state`). Evaluation runs
unrecorded. Under torchrun each rank records its own stream (`OUT/rank-N`); where the Trainer
wrapped the model in DistributedDataParallel, the callback finds that wrapper and records both
sides of each gradient sum, as `ModelRecorder` does for any DDP model (this rank's share,
`NAME.grad.local`, and the sum, `NAME.grad`); an FSDP2 model is recorded by its shards. Under
`repro record -- python train.py` (or `gate`, `bisect`) the repro command's
settings win, as `ModelRecorder.create_or_gated` reads them; a fault (`REPRO_PERTURB`) is planted
as in any `ModelRecorder`. The trace is finished when training ends (`on_train_end`); a run that
raises leaves it unfinished, as repro's readers then say.
"""

from __future__ import annotations

import gc
from typing import Optional

import torch
from transformers import TrainerCallback

from .ddp import is_ddp
from .model import CapturedStep, ModelRecorder


class ReproCallback(TrainerCallback):
    """Records a `Trainer`'s optimizer steps into a repro trace (see the module)."""

    def __init__(self, path: str = "runs/trainer", run: Optional[dict] = None, **options):
        """`path`: where the trace goes, unless a repro command says otherwise. `run`: the run
        settings for the header (default: the model's class, the steps, seed, batch size,
        gradient accumulation and learning rate from the `TrainingArguments`). `options`: as
        `ModelRecorder.create_or_gated` takes them: `options=RecordOptions(...)`, and options by
        name (`capture`, `modules`, `ops`, `data_hash`, ...)."""
        self.path, self.run, self.options = path, run, options
        self.recorder: Optional[ModelRecorder] = None
        self._step = None  # the open `training_step` block
        self._captured: Optional[CapturedStep] = None
        self._calls = 0  # forward calls of the model in this step (micro-batches)
        self._hooks: list = []

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        run = self.run if self.run is not None else {
            "workload": type(model).__name__,
            "steps": state.max_steps,
            "seed": args.seed,
            "batch": args.per_device_train_batch_size,
            "accum": args.gradient_accumulation_steps,
            "lr": args.learning_rate,
        }
        self.recorder = ModelRecorder.create_or_gated(self.path, run, ddp_wrapper(model) or model,
                                                      optimizer=kwargs.get("optimizer"), **self.options)
        self._hooks = [model.register_forward_pre_hook(self._batch, with_kwargs=True),
                       model.register_forward_hook(self._loss)]

    def on_step_begin(self, args, state, control, **kwargs):
        self._step = self.recorder.training_step(state.global_step)
        self._captured = self._step.__enter__()
        self._calls = 0

    def _name(self, name: str) -> str:
        return name if self._calls == 0 else f"{name}#{self._calls}"

    def _batch(self, module, args, kwargs):
        """The model's forward pre-hook: its tensor arguments, as the step's inputs."""
        if self._captured is None or not module.training:
            return None
        named = [(f"arg{i}", a) for i, a in enumerate(args)] + list(kwargs.items())
        for name, value in named:
            if isinstance(value, torch.Tensor):
                self._captured.step.queue(self._name(name), value, "input")
        return None

    def _loss(self, module, args, output):
        """The model's forward hook: the loss it returns (a transformers `ModelOutput`'s `loss`)."""
        if self._captured is None or not module.training:
            return None
        loss = output.get("loss") if isinstance(output, dict) else getattr(output, "loss", None)
        if isinstance(loss, torch.Tensor):
            self._captured.loss(loss, self._name("loss"))
        self._calls += 1
        return None

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        if self._captured is not None:
            self._captured.gradients()

    def on_optimizer_step(self, args, state, control, **kwargs):
        """Closes the step right after the optimizer's: its updated parameters."""
        step, self._step, self._captured = self._step, None, None
        if step is not None:
            step.__exit__(None, None, None)

    def on_train_end(self, args, state, control, **kwargs):
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
        if self.recorder is not None and not self.recorder.recorder.finished:
            self.recorder.finish()


def ddp_wrapper(model: torch.nn.Module) -> Optional[torch.nn.parallel.DistributedDataParallel]:
    """The DistributedDataParallel module that wraps `model`, where one does; else None.
    (Trainer's callbacks are given the model it wrapped, not the wrapper. The wrapper holds the
    model in its `_modules` dict, under `module`; found once, before the first step, by what
    refers to that dict: the wrapper itself, or the wrapper's attribute dict, and then the
    wrapper.)"""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return None
    for modules in gc.get_referrers(model):
        if not isinstance(modules, dict) or modules.get("module") is not model:
            continue
        for holder in gc.get_referrers(modules):
            owners = [holder]
            if isinstance(holder, dict) and holder.get("_modules") is modules:
                owners = gc.get_referrers(holder)
            for owner in owners:
                if is_ddp(owner) and owner.module is model:
                    return owner
    return None
