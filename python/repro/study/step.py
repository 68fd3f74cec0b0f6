"""One training step of a study: cross-entropy, backward pass and optimizer step, plain or
recorded (with `s`, the step `repro.torch.ModelRecorder.training_step` hands out: the loss when
computed, the gradients after the backward pass)."""

from typing import Optional

import torch.nn.functional as F


def training_step(model, opt, x, y, s: Optional[object] = None) -> None:
    opt.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(x), y)
    if s is not None:
        s.loss(loss)
    loss.backward()
    if s is not None:
        s.gradients()
    opt.step()
