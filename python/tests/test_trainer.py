"""One line in a transformers `Trainer` records its training (issue 68, item 3): two same-seed
runs are IDENTICAL, and a fault planted in one module's output at one step is found there.
Skipped where torch or transformers is not installed."""

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from recorded_program import check_one_line_callback  # noqa: E402  (beside this file)

try:
    import torch  # noqa: F401
    import transformers  # noqa: F401
except ImportError:  # pragma: no cover
    transformers = None

# A 2-layer GPT-2 of width 16 trained by the Trainer on 16 random sequences for 3 optimizer steps
# of 2 micro-batches of 2: the callback is the one line repro adds.
PROGRAM = """\
import sys

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

from repro_torch.trainer import ReproCallback

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
"""


@unittest.skipUnless(transformers is not None, "torch or transformers is not installed")
class TrainerCallbackTest(unittest.TestCase):
    def test_a_trainer_is_recorded_by_one_callback_and_a_planted_fault_found_at_its_step(self):
        names = ("input_ids", "labels", "input_ids#1", "loss", "loss#1", "transformer.h.1.mlp",
                 "transformer.wte.weight", "transformer.wte.weight.grad", "transformer.wte.weight.updated")
        check_one_line_callback(self, PROGRAM, names, "transformer.h.1.mlp", "1:transformer.h.1.mlp:100000")


if __name__ == "__main__":
    unittest.main()
