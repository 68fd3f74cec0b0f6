"""One line in a transformers `Trainer` records its training (issue 68, item 3): two same-seed
runs are IDENTICAL, and a fault planted in one module's output at one step is found there.
Skipped where torch or transformers is not installed."""

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from recorded_program import check_one_line_callback, example  # noqa: E402  (beside this file)

try:
    import torch  # noqa: F401
    import transformers  # noqa: F401
except ImportError:  # pragma: no cover
    transformers = None


@unittest.skipUnless(transformers is not None, "torch or transformers is not installed")
class TrainerCallbackTest(unittest.TestCase):
    def test_a_trainer_is_recorded_by_one_callback_and_a_planted_fault_found_at_its_step(self):
        names = ("input_ids", "labels", "input_ids#1", "loss", "loss#1", "transformer.h.1.mlp",
                 "transformer.wte.weight", "transformer.wte.weight.grad", "transformer.wte.weight.updated")
        program = example("trainer_gpt2.py")  # the callback is the one line repro adds
        check_one_line_callback(self, program, names, "transformer.h.1.mlp", "1:transformer.h.1.mlp:100000")


if __name__ == "__main__":
    unittest.main()
