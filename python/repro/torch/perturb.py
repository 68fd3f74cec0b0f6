"""A planted fault (REPRO_PERTURB): one element of a named tensor moved by a number of units in
the last place, inside the autograd graph."""

from __future__ import annotations

import difflib

import torch

from repro.writer import WriteError

from .tensors import INT_OF_WIDTH

class Perturbation:
    """A planted fault, `STEP:TENSOR:ULPS[@ELEMENT]` (REPRO_PERTURB): element ELEMENT of the
    tensor of that name moves by ULPS representable values at step STEP."""

    def __init__(self, text: str):
        try:
            step, rest = text.split(":", 1)
            tensor, ulps = rest.rsplit(":", 1)
            ulps, _, element = ulps.partition("@")
            self.step, self.tensor, self.ulps = int(step), tensor, int(ulps)
            self.element = int(element) if element else 0
        except ValueError:
            raise WriteError(f"REPRO_PERTURB={text}: expected STEP:TENSOR:ULPS[@ELEMENT]") from None
        if self.ulps == 0 or not tensor:
            raise WriteError(f"REPRO_PERTURB={text}: expected STEP:TENSOR:ULPS[@ELEMENT]")

    def __str__(self) -> str:
        """`STEP:TENSOR:ULPS[@ELEMENT]`, as repro's candle side writes it (element 0 left out): the
        text a trace's header keeps as its `perturb` setting."""
        element = f"@{self.element}" if self.element != 0 else ""
        return f"{self.step}:{self.tensor}:{self.ulps}{element}"

    def unplanted(self, reachable: set, steps: list) -> WriteError:
        """The error for a fault that reached nothing while the steps `steps` were recorded:
        what is wrong with its step or its tensor, the names it could have reached (`reachable`,
        the tensors passed through `StepRecorder.perturbed`), the closest few first, and the
        steps recorded."""
        reasons = []
        if self.step not in steps:
            reasons.append(f"step {self.step} was never recorded")
        if self.tensor in reachable:
            if not reasons:
                reasons.append(f"`{self.tensor}` did not pass through the recorder at step {self.step} (it did at "
                               "other steps)")
        else:
            reasons.append(f"no tensor `{self.tensor}` passed through the recorder at any step")
        if reachable:
            closest = difflib.get_close_matches(self.tensor, sorted(reachable), n=CLOSEST_NAMES, cutoff=0.0)
            names = (f"the names it reaches, the closest first: {', '.join(f'`{n}`' for n in closest)}"
                     f"{f' ({len(reachable)} in all)' if len(reachable) > len(closest) else ''}")
        else:
            names = "it reaches no name: nothing passed through `StepRecorder.perturbed`"
        return WriteError(
            f"REPRO_PERTURB={self}: the fault was planted nowhere: {' and '.join(reasons)}; {names}; steps recorded: "
            f"{steps_text(steps)}. A fault reaches a module's output by its module path (ModelRecorder), or a tensor "
            "passed through `StepRecorder.perturbed` by the name given there"
        )

    def apply(self, t: torch.Tensor) -> torch.Tensor:
        """`t` plus a constant that moves its element (floats only) and leaves every other element
        bit for bit: a fault in the autograd graph, so gradients flow through the moved element as
        through a real one (replacing the element would cut them)."""
        if not t.is_floating_point():
            raise WriteError(f"REPRO_PERTURB: `{self.tensor}` is {t.dtype}, not a float tensor")
        if self.element >= t.numel():
            raise WriteError(f"REPRO_PERTURB: `{self.tensor}` has {t.numel()} elements, no element {self.element}")
        original = t.detach().reshape(-1)[self.element : self.element + 1]
        moved = self._moved(original)
        # x + -0.0 is x for every x, -0.0 included (x + 0.0 would turn -0.0 into +0.0).
        delta = torch.full((t.numel(),), -0.0, dtype=t.dtype, device=t.device)
        delta[self.element : self.element + 1] = moved - original
        out = t + delta.reshape(t.shape)
        if not same_bits(out.detach().reshape(-1)[self.element : self.element + 1], moved):
            raise WriteError(f"REPRO_PERTURB: element {self.element} of `{self.tensor}` ({original.item()}) cannot be "
                             f"moved by {self.ulps} ULPs: the difference is no {t.dtype} value to add")
        return out

    def _moved(self, value: torch.Tensor) -> torch.Tensor:
        """A copy of the one-element float tensor `value` moved by ULPS representable values
        (-0.0 and +0.0 counting as one)."""
        value = value.clone()
        width = value.element_size()
        ints = value.view(INT_OF_WIDTH[width])
        bits = int(ints.item()) & ((1 << (8 * width)) - 1)
        sign = 1 << (8 * width - 1)
        ordinal = (-(bits & (sign - 1)) if bits & sign else bits) + self.ulps
        bits = sign | -ordinal if ordinal < 0 else ordinal
        if bits >= sign:
            bits -= 1 << (8 * width)  # as the signed integer of that width
        ints.fill_(bits)
        return value


# How many of the names a fault could reach its error lists, the closest to its tensor's first.
CLOSEST_NAMES = 5


# How many runs of consecutive steps `steps_text` lists before it says how many steps there are.
STEP_RUNS_LISTED = 8


def steps_text(steps: list) -> str:
    """Increasing step numbers as runs of consecutive ones, `0 to 7, 9, 12 to 15` (the first
    `STEP_RUNS_LISTED` of them); `none` when empty."""
    if not steps:
        return "none"
    runs, start = [], steps[0]
    for before, step in zip(steps, steps[1:] + [None]):
        if step != before + 1:
            runs.append(f"{start} to {before}" if before > start else f"{start}")
            start = step
    if len(runs) > STEP_RUNS_LISTED:
        return f"{', '.join(runs[:STEP_RUNS_LISTED])}, ... ({len(steps)} steps, the last {steps[-1]})"
    return ", ".join(runs)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two float tensors of one dtype hold the same bits (NaN payloads and zeros' signs
    included)."""
    ints = INT_OF_WIDTH[a.element_size()]
    return torch.equal(a.view(ints), b.view(ints))


