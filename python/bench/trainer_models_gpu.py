"""transformers models this repository did not write, trained by transformers' own `Trainer` on
a GPU and recorded by its one line (`callbacks=[ReproCallback(...)]`): the front door measured on
programs as users run them (issue 68).

    python3 python/bench/trainer_models_gpu.py MODEL TRACE OUTPUT_DIR [--steps N] [--batch B]
        [--length L] [--deterministic] [--plain]

MODEL: `bert` (BERT-base masked LM, 110M parameters), `qwen2` (a Qwen2 causal LM of 0.5B
parameters' shape, bf16 mixed precision) or `t5` (T5-base, 223M). The model is built from its
config with random weights (no download) and trains on random token ids. `--deterministic`: the
Trainer's `full_determinism` (torch.use_deterministic_algorithms and cuDNN's switches). `--plain`:
no callback (the time without repro). Prints the median time of an optimizer step after the
first three, measured by a callback of its own that synchronizes the GPU.
"""

import argparse
import statistics
import time

import torch
from transformers import (BertConfig, BertForMaskedLM, Qwen2Config, Qwen2ForCausalLM, T5Config,
                          T5ForConditionalGeneration, Trainer, TrainerCallback, TrainingArguments)

from repro.torch.trainer import ReproCallback


def build(name: str):
    if name == "bert":
        return BertForMaskedLM(BertConfig()), 30522, False
    if name == "qwen2":
        config = Qwen2Config(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=24,
                             num_attention_heads=16, num_key_value_heads=16, max_position_embeddings=2048,
                             tie_word_embeddings=True)
        return Qwen2ForCausalLM(config), 32000, True
    if name == "t5":
        return T5ForConditionalGeneration(T5Config(d_model=768, d_ff=3072, num_layers=12, num_heads=12)), 32128, False
    raise SystemExit(f"unknown model {name!r}: bert, qwen2 or t5")


class StepTimes(TrainerCallback):
    """Wall time of each optimizer step, the GPU synchronized at both ends."""

    def __init__(self):
        self.times, self._start = [], None

    def on_step_begin(self, args, state, control, **kwargs):
        torch.cuda.synchronize()
        self._start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        torch.cuda.synchronize()
        self.times.append(time.perf_counter() - self._start)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("trace")
    p.add_argument("output_dir")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--length", type=int, default=512)
    p.add_argument("--deterministic", action="store_true")
    p.add_argument("--plain", action="store_true")
    a = p.parse_args()
    torch.manual_seed(0)
    model, vocab, bf16 = build(a.model)
    ids = torch.randint(0, vocab, (a.batch * a.steps, a.length), generator=torch.Generator().manual_seed(1))
    data = [{"input_ids": row, "labels": row} for row in ids]
    args = TrainingArguments(output_dir=a.output_dir, max_steps=a.steps, per_device_train_batch_size=a.batch,
                             learning_rate=1e-4, report_to="none", save_strategy="no", logging_strategy="no",
                             disable_tqdm=True, seed=0, bf16=bf16, full_determinism=a.deterministic,
                             dataloader_num_workers=0)
    timer = StepTimes()
    callbacks = [timer] if a.plain else [ReproCallback(a.trace), timer]
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=callbacks)
    trainer.train()
    parameters = sum(p.numel() for p in model.parameters())
    steady = timer.times[3:]
    print(f"{a.model}: {parameters / 1e6:.0f}M parameters, batch {a.batch} x {a.length}, "
          f"{'plain' if a.plain else 'recorded'}{', deterministic' if a.deterministic else ''}: "
          f"median step {statistics.median(steady) * 1e3:.1f} ms over {len(steady)} steps "
          f"(min {min(steady) * 1e3:.1f}, max {max(steady) * 1e3:.1f})")


if __name__ == "__main__":
    main()
