"""One line in a Lightning `Trainer` records its training (issue 68, item 3): two same-seed runs
are IDENTICAL, and a fault planted in one module's output at one step is found there. Skipped
where torch or lightning is not installed."""

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from recorded_program import check_one_line_callback  # noqa: E402  (beside this file)

try:
    import lightning  # noqa: F401
    import torch  # noqa: F401
except ImportError:  # pragma: no cover
    lightning = None

# A small LightningModule trained for 3 optimizer steps of 2 accumulated micro-batches of 4: the
# callback is the one line repro adds.
PROGRAM = """\
import sys

import lightning
import torch

from repro.torch.lightning import ReproCallback


class Regressor(lightning.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


lightning.seed_everything(0)
model = Regressor()
g = torch.Generator().manual_seed(1)
data = torch.utils.data.TensorDataset(torch.randn(64, 8, generator=g), torch.randn(64, 1, generator=g))
trainer = lightning.Trainer(max_steps=3, accumulate_grad_batches=2, accelerator="cpu", devices=1, logger=False,
                            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                            default_root_dir=sys.argv[2], callbacks=[ReproCallback(sys.argv[1])])
trainer.fit(model, torch.utils.data.DataLoader(data, batch_size=4))
"""


@unittest.skipUnless(lightning is not None, "torch or lightning is not installed")
class LightningCallbackTest(unittest.TestCase):
    def test_a_lightning_trainer_is_recorded_by_one_callback_and_a_planted_fault_found_at_its_step(self):
        names = ("batch.0", "batch.1", "batch.0#1", "loss", "loss#1", "net.0", "net.2", "net.0.weight",
                 "net.0.weight.grad", "net.2.bias.updated")
        check_one_line_callback(self, PROGRAM, names, "net.0", "1:net.0:100000")


if __name__ == "__main__":
    unittest.main()
