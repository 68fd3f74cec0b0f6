"""A small PyTorch training run recorded with repro.torch: an MLP regressing seeded data.

    python python/examples/torch_mlp.py runs/torch-a      # records into runs/torch-a
    repro gate -- python python/examples/torch_mlp.py     # twice under the gate, compared
"""

import sys

import torch

from repro.torch import ModelRecorder

STEPS = 8

torch.manual_seed(0)
torch.use_deterministic_algorithms(True)
model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
run = {"workload": "torch-mlp", "steps": STEPS, "params": {"lr": "0.05", "batch": "32"}}
out = sys.argv[1] if len(sys.argv) > 1 else "runs/torch-mlp"
rec = ModelRecorder.create_or_gated(out, run, model)
data = torch.Generator().manual_seed(1)
for step in range(STEPS):
    x = torch.rand(32, 4, generator=data)
    y = x.sum(dim=1, keepdim=True).sin()
    opt.zero_grad()
    with rec.training_step(step, inputs={"x": x, "y": y}) as s:
        loss = torch.nn.functional.mse_loss(model(x), y)
        s.loss(loss)
        loss.backward()
        s.gradients()
        opt.step()
print(f"recorded {rec.finish()} steps", file=sys.stderr)
