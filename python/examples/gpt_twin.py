"""A PyTorch twin of repro's built-in `gpt` workload, fed the same initial weights and batches,
to compare training across frameworks (docs/pytorch.md, "A candle run against PyTorch"):

    repro record --workload gpt --steps 10 --capture all --out runs/candle
    python python/examples/gpt_twin.py runs/candle runs/torch
    repro diff runs/candle runs/torch --map python/examples/gpt_twin.map --tolerance rel:1e-3

It reads the candle trace: the settings from its header, every parameter at step 0, and each
step's `tokens` and `targets` (so record it with `--capture all`). The model is the same GPT-2
shape under the same parameter names (op-built layer norms, exact GELU, causal softmax
attention, AdamW with candle's defaults), so parameters, gradients and updates pair by name.
"""

import math
import sys

import numpy as np
import torch
from torch import nn

from repro.torch import ModelRecorder
from repro.trace import Trace

_NUMPY = {"U32": np.uint32, "I64": np.int64, "F32": np.float32}


class Attention(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.c_attn = nn.Linear(width, 3 * width)
        self.c_proj = nn.Linear(width, width)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = (y.reshape(b, t, self.heads, c // self.heads).transpose(1, 2) for y in self.c_attn(x).split(c, -1))
        mask = torch.full((t, t), float("-inf")).triu(1)
        scores = q @ k.transpose(-1, -2) / math.sqrt(c // self.heads) + mask
        return self.c_proj((scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, c))


class Mlp(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.c_fc, self.c_proj = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x):
        return self.c_proj(nn.functional.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.ln_1, self.attn = nn.LayerNorm(width, eps=1e-5), Attention(width, heads)
        self.ln_2, self.mlp = nn.LayerNorm(width, eps=1e-5), Mlp(width)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Gpt(nn.Module):
    def __init__(self, vocab: int, context: int, layers: int, width: int, heads: int):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, width), nn.Embedding(context, width)
        self.h = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln_f, self.lm_head = nn.LayerNorm(width, eps=1e-5), nn.Linear(width, vocab)

    def forward(self, tokens):
        x = self.wte(tokens) + self.wpe(torch.arange(tokens.shape[1]))
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def tensor(trace: Trace, step, name: str) -> torch.Tensor:
    record = next(t for t in step.tensors if t.name == name)
    values = trace.values(step, record)
    if values is None:
        sys.exit(f"{trace.path}: step {step.step} keeps only the hash of `{name}`: record the candle run with --capture all")
    return torch.from_numpy(np.frombuffer(values, dtype=_NUMPY[record.dtype]).reshape(record.shape).copy())


def main(candle: str, out: str) -> None:
    torch.manual_seed(0)
    with Trace(candle) as trace:
        run = trace.header["run"]
        p = {k: int(v) for k, v in run["params"].items() if k in ("context", "layers", "width", "heads")}
        model = Gpt(256, p["context"], p["layers"], p["width"], p["heads"])
        steps = list(trace.steps())
        with torch.no_grad():
            for name, param in model.named_parameters():
                param.copy_(tensor(trace, steps[0], name))
        batches = [(tensor(trace, s, "tokens"), tensor(trace, s, "targets")) for s in steps]
    lr = float(run["params"]["lr"])
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    twin = {"workload": "gpt-torch-twin", "steps": run["steps"], "params": run["params"]}
    rec = ModelRecorder.create_or_gated(out, twin, model, modules="none", capture="all")
    for step, (tokens, targets) in enumerate(batches):
        opt.zero_grad()
        # Recorded as candle's (U32), computed on as PyTorch indexes (int64).
        with rec.training_step(step, inputs={"tokens": tokens, "targets": targets}) as s:
            logits = model(tokens.long())
            loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.long().reshape(-1))
            s.loss(loss)
            loss.backward()
            s.gradients()
            opt.step()
    print(f"recorded {rec.finish()} steps of the twin into {out}", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "runs/gpt-torch-twin")
