"""A transformers `Trainer` recorded by one line (`callbacks=[ReproCallback(...)]`): a 2-layer
GPT-2 of width 16 trained on 16 random sequences for 3 optimizer steps of 2 micro-batches of 2,
on the CPU.

    python python/examples/trainer_gpt2.py runs/a /tmp/trainer-out     # TRACE OUTPUT_DIR
    repro record --out runs/a -- python python/examples/trainer_gpt2.py runs/a /tmp/trainer-out
    repro gate -- python python/examples/trainer_gpt2.py runs/x /tmp/trainer-out
"""

import sys

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

from repro.torch.trainer import ReproCallback

torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=2, n_head=2, bos_token_id=0,
                                   eos_token_id=0))
ids = torch.randint(0, 64, (16, 16), generator=torch.Generator().manual_seed(1))
data = [{"input_ids": row, "labels": row} for row in ids]
args = TrainingArguments(output_dir=sys.argv[2], max_steps=3, per_device_train_batch_size=2,
                         gradient_accumulation_steps=2, learning_rate=1e-3, report_to="none", use_cpu=True,
                         save_strategy="no", logging_strategy="no", disable_tqdm=True, seed=0)
trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[ReproCallback(sys.argv[1])])
trainer.train()
