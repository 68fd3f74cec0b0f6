"""Hugging Face Accelerate with repro's plain API: a small MLP trained by an `Accelerator` (on
the CPU here; the same lines on GPUs), recorded by `ModelRecorder` around the prepared model. The
lines repro adds are marked `# repro`: six, the import among them.

    python python/examples/accelerate_mlp.py runs/a
    repro record --out runs/a -- python python/examples/accelerate_mlp.py runs/a
    repro gate -- python python/examples/accelerate_mlp.py runs/x
"""

import sys

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed

from repro.torch import ModelRecorder  # repro

STEPS = 3

set_seed(0)
accelerator = Accelerator(cpu=True)
model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
x = torch.rand(48, 4, generator=torch.Generator().manual_seed(1))
data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True).sin()), batch_size=16)
model, opt, data = accelerator.prepare(model, opt, data)
run = {"workload": "accelerate-mlp", "steps": STEPS}
rec = ModelRecorder.create_or_gated(sys.argv[1], run, accelerator.unwrap_model(model))  # repro
for step, (inputs, targets) in enumerate(data):
    opt.zero_grad()
    with rec.training_step(step, inputs={"x": inputs, "y": targets}) as s:  # repro
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        s.loss(loss)  # repro
        accelerator.backward(loss)
        s.gradients()  # repro
        opt.step()
rec.finish()  # repro
