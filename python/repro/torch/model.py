"""Recording a `torch.nn.Module` with no per-op code: `ModelRecorder` and the step it hands out,
`CapturedStep`. A model wrapped in DistributedDataParallel is recorded by its module's names, with
both sides of each gradient sum (`ddp`); an FSDP2 model by each rank's shards (`fsdp`)."""

from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Iterator, Optional

import torch

from repro.writer import ALL_REDUCE_SUM, REDUCE_SCATTER_SUM, step_policy

from . import fsdp
from .ddp import GradientSums, is_ddp
from .options import RecordOptions
from .recorder import RecordGroup, Recorder, StepRecorder, record_fields
from .sources import call_site

class ModelRecorder:
    """Records a module's training steps or forward passes with no per-op code (see the module's
    documentation)."""

    def __init__(self, recorder: Recorder, model: torch.nn.Module, modules: Optional[str] = None,
                 ops: Optional[str] = None, optimizer: Optional[torch.optim.Optimizer] = None, scaler=None):
        """Every step records the inputs, parameters, buffers, the random generators' states at
        its start (`rng.cpu`, `rng.cuda:N`, kind `rng_state`), the loss, gradients and updates,
        and with `optimizer` (and a `torch.amp.GradScaler`, `scaler`) their state after the
        update (kind `optimizer_state`: `OptimizerState`); the
        steps the recorder's `modules` level names record every module's output too, and those
        its `ops` level names every aten op's output (`Recorder`; `modules`, `ops`: step policies
        to set them to, before the first step; `modules="none"` as when the other run's graph is
        named otherwise). Buffers are the ones registered when the recorder is made, by module
        path (their `state_dict` names; a non-persistent one, which `state_dict` leaves out, by
        the same path). A DDP model is recorded by its module's names, and its gradient sums
        through a communication hook; an FSDP2 model's shards are checked to tile their
        parameters (with every rank, here). A model compiled by `torch.compile` is recorded by its
        original module's names, without module outputs (a note on stderr says so, and the
        header's `modules` level is `none`)."""
        self.recorder = recorder
        model, compiled = _uncompiled(model)
        self.model = model.module if is_ddp(model) else model
        self.model, inner = _uncompiled(self.model)
        self._compiled = compiled or inner
        asked = step_policy("modules policy", modules) if modules is not None else recorder.levels["modules"]
        if self._compiled and asked != ("none",):
            modules = "none"
            print("repro.torch: the model is compiled by torch.compile: its module outputs are not recorded (hooks "
                  "inside a compiled graph would break it or the graph); recording its inputs, parameters, buffers, "
                  "loss, gradients and updates, under the uncompiled model's names", file=sys.stderr)
        ops_asked = step_policy("ops policy", ops) if ops is not None else recorder.levels["ops"]
        if self._compiled and ops_asked != ("none",):
            print("repro.torch: the model is compiled by torch.compile: the `ops` level records the aten ops PyTorch's "
                  "dispatcher runs outside its compiled graphs (the optimizer's, a loss computed outside the model), "
                  "not the kernels inside them, which the dispatcher never sees", file=sys.stderr)
        if modules is not None or ops is not None:
            recorder.set_levels(modules, ops)
        # A world of one records as one device: its "sums" are its own gradients.
        self._sums = GradientSums(model) if is_ddp(model) and recorder.place is not None else None
        # The parameters by name, looked up once (walking the module tree costs every step).
        self._named_parameters = list(self.model.named_parameters())
        sharded = any(fsdp.is_sharded(p) for _, p in self._named_parameters)
        self._shards = fsdp.check_tiling(self._named_parameters) if sharded else {}
        # The shares FSDP2 reduces and scatters (a world of one sums nothing).
        if self._shards and recorder.place is not None:
            self._sums = fsdp.GradientShares(self.model, self._named_parameters)
        # The parameters' records at a step's start, their gradients' and their updates': each
        # record's fields made once, the group queued at once (`StepRecorder.queue_group`). An
        # FSDP2 parameter (and its gradient) is recorded as this rank's block of it, in place.
        self._tensors = [p for _, p in self._named_parameters]
        self._places = [self._shard_place(name, p) for name, p in self._named_parameters]
        self._groups = {
            suffix: RecordGroup([record_fields(name + suffix, kind, phase, shard=place)
                                 for (name, _), place in zip(self._named_parameters, self._places)])
            for suffix, kind, phase in _PARAMETER_RECORDS
        }
        # The registered buffers (BatchNorm's running statistics, counters, masks; non-persistent
        # ones too) by module path, as (name, module, key): looked up in their module at every step,
        # since a module may replace a buffer (`model.to` does). Each rank records its own (DDP
        # broadcasts rank 0's at each forward, which then updates each rank's from its rows).
        self._buffer_slots = [(name, self.model.get_submodule(path), key)
                              for name, _ in self.model.named_buffers() for path, _, key in [name.rpartition(".")]]
        self._buffer_groups = {
            suffix: RecordGroup([record_fields(name + suffix, "buffer", phase) for name, _, _ in self._buffer_slots],
                                repeats=False)
            for suffix, phase in _BUFFER_RECORDS
        }
        # The gradients' groups by which parameters have one and which are sums of shares.
        self._partial_gradients: dict[tuple, RecordGroup] = {}
        self._step: Optional[StepRecorder] = None
        self._calls: dict[str, int] = {}
        # Every module but the root, by module path; each one's forward hook, which records its
        # output and plants REPRO_PERTURB's fault. The hooks are registered only for the steps
        # that need them (`_hooked`): a step without them runs the model as it would unrecorded.
        self._named_modules = [(name, m) for name, m in self.model.named_modules() if name != ""]
        self._output_hooks = [(m, self._hook(name)) for name, m in self._named_modules]
        self._hooks: list = []
        self._optimizer = OptimizerState(optimizer, self._named_parameters, scaler) \
            if optimizer is not None or scaler is not None else None

    @classmethod
    def create_or_gated(
        cls, path: str, run: dict, model: torch.nn.Module, options: Optional[RecordOptions] = None,
        optimizer: Optional[torch.optim.Optimizer] = None, scaler=None, **changes
    ) -> "ModelRecorder":
        """`Recorder.create_or_gated` for `model`, on the device of its first parameter, with
        `options` and `changes` by option name (`modules="every:10"`; what a repro command
        running the program asks wins); `optimizer`, `scaler`: whose state to record."""
        device = next((p.device for p in model.parameters()), None)
        return cls(Recorder.create_or_gated(path, run, device=device, options=options, **changes), model,
                   optimizer=optimizer, scaler=scaler)

    def _hook(self, name: str):
        def hook(module, args, output):
            s = self._step
            if s is None:
                return None
            calls = self._calls.get(name, 0)
            self._calls[name] = calls + 1
            path = name if calls == 0 else f"{name}#{calls}"
            if isinstance(output, torch.Tensor):
                output = s.perturbed(path, output)
                if s.records_modules:
                    s.module_output(path, output, call_site(sys._getframe(1)))
                return output
            if s.records_modules:
                source = call_site(sys._getframe(1))
                for key, value in _tensors_of(output):
                    s.module_output(f"{path}.{key}", value, source)
            return None

        return hook

    def _hooked(self, s: StepRecorder) -> list:
        """Registers the hooks step `s` needs, and returns their handles: the forward hooks where
        it records module outputs, or a fault waits to be planted (until then, at every step, so
        that its error names the modules it could reach); where it records ops (`s.ops`), hooks
        that keep the paths of the modules whose forward runs (not in a compiled model, whose
        graph they would break)."""
        recorder = self.recorder
        handles = []
        if s.records_modules or recorder.perturbation is not None and not recorder.perturbation_planted:
            handles += [m.register_forward_hook(hook) for m, hook in self._output_hooks]
        if s.ops is not None and not self._compiled:
            for name, m in self._named_modules:
                entered, left = _path_hooks(s.ops.modules, name)
                handles.append(m.register_forward_pre_hook(entered))
                handles.append(m.register_forward_hook(left, always_call=True))
        return handles

    def training_step(self, step: int, inputs: Optional[dict] = None):
        """A training step: the inputs, parameters and buffers at entry, every module's output
        while the block runs, `loss` and `gradients` when called, the updated parameters and the
        buffers as they are then at exit (`NAME.updated`)."""
        return self._captured(step, inputs, updates=True)

    def forward_pass(self, step: int, inputs: Optional[dict] = None):
        """A forward pass (inference): the inputs, parameters and buffers, and every module's
        output."""
        return self._captured(step, inputs, updates=False)

    @contextmanager
    def _captured(self, step: int, inputs: Optional[dict], updates: bool) -> Iterator["CapturedStep"]:
        with self.recorder.step(step) as s:
            for name, t in (inputs or {}).items():
                s.queue(name, t, "input")
            self._queue_parameters(s, "")
            self._queue_buffers(s, "")
            _queue_generators(s)
            s.flush()
            self._step, self._calls = s, {}
            self._hooks = self._hooked(s)
            if self._sums is not None:
                self._sums.begin(s)
            try:
                yield CapturedStep(self, s)
            finally:
                self._step = None
                for h in self._hooks:
                    h.remove()
                self._hooks = []
                if self._sums is not None:
                    self._sums.begin(None)
            if updates:
                # The optimizer's state first: the update computed it (the moments, the
                # learning rate applied) before the parameters from it.
                if self._optimizer is not None:
                    self._optimizer.queue(s)
                self._queue_parameters(s, ".updated")
                self._queue_buffers(s, ".updated")
                s.flush()

    def _shard_place(self, name: str, p: torch.Tensor) -> Optional[tuple]:
        """Where this rank's block of the FSDP2 parameter `name` sits in it (a record's `shard`),
        or None for a parameter that is not sharded."""
        return fsdp.shard_of(p, self._shards[name])[1] if name in self._shards else None

    def _gradient_group(self, present: tuple, summed: tuple) -> RecordGroup:
        """The group of the gradients of the parameters at indices `present` (those that have
        one: all of them, or, with frozen or unused parameters, the same few at every step);
        `summed[k]`, this rank's share of the `k`th's sum, when recorded (DDP, FSDP2), else None."""
        group = self._groups[".grad"]
        if len(present) == len(group.fields) and not any(summed):
            return group
        key = (present, summed)
        if key not in self._partial_gradients:
            if len(self._partial_gradients) >= 16:  # a program whose gradients keep changing
                self._partial_gradients.clear()
            fields = []
            for i, share in zip(present, summed):
                if share is None:
                    fields.append(group.fields[i])
                    continue
                place = self._places[i]
                fields.append(record_fields(f"{self._named_parameters[i][0]}.grad", "gradient", "backward",
                                            inputs=(share,), shard=place,
                                            collective=ALL_REDUCE_SUM if place is None else REDUCE_SCATTER_SUM))
            self._partial_gradients[key] = RecordGroup(fields)
        return self._partial_gradients[key]

    def _blocks(self, tensors: list) -> list:
        """`tensors` (the parameters, or their gradients) as this rank holds them: an FSDP2 one
        as its own block."""
        if not self._shards:
            return tensors
        return [fsdp.local(t) if place is not None and fsdp.is_sharded(t) else t
                for t, place in zip(tensors, self._places)]

    def _queue_parameters(self, s: StepRecorder, suffix: str) -> None:
        """Queues every parameter's record (`suffix` "": at the step's start; ".updated": at its
        end): an FSDP2 parameter as this rank's block of it."""
        s.queue_group(self._groups[suffix], self._blocks(self._tensors))

    def _queue_buffers(self, s: StepRecorder, suffix: str) -> None:
        """Queues every buffer's record (`suffix` "": at the step's start; ".updated": at its end),
        as its module holds it now; a buffer its module has since set to None is left out. None
        repeats an earlier record of the same memory and version (`RecordGroup(repeats=False)`):
        BatchNorm updates its running statistics in place without moving their version counters."""
        buffers = [module._buffers.get(key) for _, module, key in self._buffer_slots]
        group = self._buffer_groups[suffix]
        if all(b is not None for b in buffers):
            s.queue_group(group, buffers)
        else:
            present = [i for i, b in enumerate(buffers) if b is not None]
            s.queue_each([group.fields[i] for i in present], [buffers[i] for i in present], repeats=False)

    def __enter__(self) -> "ModelRecorder":
        return self

    def __exit__(self, kind, error, traceback) -> bool:
        """Removes every hook the recorder put on the model, and finishes the trace as
        `Recorder.__exit__` does (as stopped by the exception, when the block raised)."""
        self._unhook()
        return self.recorder.__exit__(kind, error, traceback)

    def _unhook(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []
        if self._sums is not None:
            self._sums.remove()

    def finish(self) -> int:
        """Removes the recorder's hooks and finishes the trace; the number of steps written."""
        self._unhook()
        return self.recorder.finish()


class CapturedStep:
    """What a training step records besides what the hooks see."""

    def __init__(self, owner: ModelRecorder, s: StepRecorder):
        self._owner, self.step = owner, s

    def output(self, name: str, t: torch.Tensor, kind: str = "prediction") -> None:
        """Records a model output (logits) under `name`."""
        self.step.record(name, t, kind, "forward", node=True)

    def loss(self, loss: torch.Tensor, name: str = "loss") -> None:
        """Records the loss."""
        self.step.record(name, loss, "loss", "forward", node=True)

    def gradients(self) -> None:
        """Records every parameter's gradient (`NAME.grad`) after `backward`, and notes the
        trainable parameters that got none. Under DDP a gradient is the sum over the ranks of the
        shares recorded as its bucket went out (a collective of `NAME.grad.local`); under FSDP2
        it is this rank's block of the sum over the ranks, which FSDP2 reduces and scatters (a
        reduce-scatter of the share recorded as the whole gradient accumulated)."""
        owner = self._owner
        grads = owner._blocks([p.grad for p in owner._tensors])
        present = tuple(i for i, g in enumerate(grads) if g is not None)
        self.step.no_gradient += [name for (name, p), g in zip(owner._named_parameters, grads)
                                  if g is None and p.requires_grad]
        sums, names = owner._sums, owner._named_parameters
        summed = tuple(sums.local_name(names[i][0]) for i in present) if sums is not None else (None,) * len(present)
        self.step.queue_group(owner._gradient_group(present, summed), [grads[i] for i in present])
        self.step.flush()
        if self.step.ops is not None:
            self.step.ops.updating = True


def _queue_generators(s: StepRecorder) -> None:
    """Queues a fingerprint of each random number generator's state at a step's start (kind
    `rng_state`): the CPU's default generator's (`rng.cpu`), and each CUDA device's default
    generator's where CUDA is initialized (`rng.cuda:N`: its seed and offset). A draw the trace
    does not record (a dropout mask, a shuffled batch) made from another state is then named
    by the state that differs, at the step it differs."""
    s.queue("rng.cpu", torch.get_rng_state(), "rng_state", "forward")
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for index, generator in enumerate(torch.cuda.default_generators):
            s.queue(f"rng.cuda:{index}", generator.get_state(), "rng_state", "forward")


class OptimizerState:
    """An optimizer's state after each step's update (kind `optimizer_state`, phase `update`):
    each parameter's tensors of state by the parameter's name (`NAME.momentum_buffer`,
    `NAME.exp_avg`, `NAME.exp_avg_sq`; an FSDP2 parameter's as this rank's block), each param
    group's scalars of state gathered into one tensor (`optimizer.param_groups.G.step`: every
    parameter's step count, in the group's order), each group's numeric hyper-parameters
    (`optimizer.param_groups.G.lr`: the learning rate the update applied; `betas`, `eps`,
    `momentum`, `weight_decay`, ...), and a gradient scaler's scale and growth tracker
    (`scaler.scale`, `scaler.growth_tracker`)."""

    def __init__(self, optimizer, named_parameters: list, scaler):
        self.optimizer, self.scaler = optimizer, scaler
        self._names = {id(p): name for name, p in named_parameters}
        # The tensors of state as last queued: their (name, key) list, and the record group made
        # for them (rebuilt when the optimizer's state gains or loses a tensor).
        self._keys: Optional[list] = None
        self._group: Optional[RecordGroup] = None

    def queue(self, s: StepRecorder) -> None:
        """Queues the state as the step's update left it: the hyper-parameters and the scaler's
        scale (what the update was computed with) first, then each parameter's state."""
        tensors, keys, scalars, hyper = [], [], [], []
        optimizer = self.optimizer
        for g, group in enumerate(optimizer.param_groups if optimizer is not None else ()):
            counts: dict = {}
            for i, p in enumerate(group["params"]):
                state = optimizer.state.get(p)
                if not state:
                    continue
                # A parameter the model does not hold, by its place in its group.
                name = self._names.get(id(p), f"optimizer.param_groups.{g}.params.{i}")
                for key in sorted(state):
                    value = state[key]
                    if isinstance(value, torch.Tensor) and value.dim() > 0:
                        keys.append((name, key))
                        tensors.append(value)
                    elif isinstance(value, (torch.Tensor, int, float)) and not isinstance(value, bool):
                        counts.setdefault(key, []).append(value)
            for key, values in sorted(counts.items()):
                scalars.append((f"optimizer.param_groups.{g}.{key}", _gathered(values)))
            for key in sorted(group):
                value = group[key]
                if isinstance(value, bool) or key == "params":
                    continue
                if isinstance(value, torch.Tensor) and value.numel() == 1 or isinstance(value, (int, float)):
                    hyper.append((f"optimizer.param_groups.{g}.{key}", _gathered([value]).reshape(())))
                elif isinstance(value, (tuple, list)) and value and all(
                        isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
                    hyper.append((f"optimizer.param_groups.{g}.{key}", torch.tensor(value, dtype=torch.float64)))
        scaler = self.scaler
        if scaler is not None and getattr(scaler, "_scale", None) is not None:
            hyper.append(("scaler.scale", scaler._scale))
            if getattr(scaler, "_growth_tracker", None) is not None:
                hyper.append(("scaler.growth_tracker", scaler._growth_tracker))
        for name, t in hyper:
            s.queue(name, t.detach(), "optimizer_state", "update")
        if tensors:
            if keys != self._keys:
                self._keys = keys
                self._group = RecordGroup([record_fields(f"{name}.{key}", "optimizer_state", "update")
                                           for name, key in keys], repeats=False)
            s.queue_group(self._group, [fsdp.local(t) if fsdp.is_sharded(t) else t for t in tensors])
        for name, t in scalars:
            s.queue(name, t.detach(), "optimizer_state", "update")


def _gathered(values: list) -> torch.Tensor:
    """Numbers and one-element tensors as one float64 tensor, on the device of the tensors among
    them (a CUDA step count is gathered there, without the wait that reading it would cost)."""
    device = next((v.device for v in values if isinstance(v, torch.Tensor)), torch.device("cpu"))
    if device.type == "cpu":
        return torch.tensor([float(v) for v in values], dtype=torch.float64)
    return torch.stack([v.detach().reshape(()).to(torch.float64) if isinstance(v, torch.Tensor)
                        else torch.tensor(float(v), dtype=torch.float64, device=device) for v in values])


# A parameter's records in a training step: their names' suffix, kind and phase.
_PARAMETER_RECORDS = (("", "weight", "forward"), (".grad", "gradient", "backward"), (".updated", "weight", "update"))
# A buffer's records in a training step, of kind `buffer`: their names' suffix and phase.
_BUFFER_RECORDS = (("", "forward"), (".updated", "update"))


def _path_hooks(paths: list, name: str) -> tuple:
    """A forward pre-hook and a forward hook that keep `name`, a module's path, last in `paths`
    while the module's forward runs."""

    def entered(module, args):
        paths.append(name)

    def left(module, args, output):
        paths.pop()

    return entered, left


def _uncompiled(model: torch.nn.Module) -> tuple[torch.nn.Module, bool]:
    """The module `torch.compile` wrapped (and True), or `model` itself (and False)."""
    original = getattr(model, "_orig_mod", None)
    if isinstance(original, torch.nn.Module) and type(model).__name__ == "OptimizedModule":
        return original, True
    return model, False


def _tensors_of(output, prefix: str = "") -> Iterator[tuple[str, torch.Tensor]]:
    """The tensors in a module's output: a tuple's or list's by index, a dict's (a transformers
    ModelOutput) by key, nested; anything else is skipped."""
    if isinstance(output, torch.Tensor):
        yield prefix.rstrip("."), output
    elif isinstance(output, dict):
        for k, v in output.items():
            yield from _tensors_of(v, f"{prefix}{k}.")
    elif isinstance(output, (tuple, list)):
        for i, v in enumerate(output):
            yield from _tensors_of(v, f"{prefix}{i}.")
