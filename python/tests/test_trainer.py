"""One line in a transformers `Trainer` records its training (issue 68, item 3): two same-seed
runs are IDENTICAL, and a fault planted in one module's output at one step is found there.
Skipped where torch or transformers is not installed."""

import os
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from recorded_program import REPRO, check_one_line_callback, example, record, torchrun  # noqa: E402  (beside this file)

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

    def test_the_trainers_own_ddp_is_recorded_per_rank_with_both_sides_of_each_gradient_sum(self):
        # The Trainer wraps the model in DistributedDataParallel itself (two CPU ranks over gloo):
        # each rank records its stream, with its share of each gradient sum found through the
        # wrapper; same-seed runs are IDENTICAL, and a fault on rank 1 alone is found at rank 1.
        from repro.trace import Trace

        program, ranks = example("trainer_gpt2.py"), torchrun(2)
        cpu = {"CUDA_VISIBLE_DEVICES": ""}
        with tempfile.TemporaryDirectory() as tmp:
            a, b = (record(self, tmp, program, name, launcher=ranks, **cpu) for name in ("a", "b"))
            for rank in (0, 1):
                with Trace(os.path.join(a, f"rank-{rank}")) as trace:
                    names = [t.name for t in list(trace.steps())[1].tensors]
                self.assertIn("transformer.wte.weight.grad.local", names)
                self.assertIn("transformer.wte.weight.grad", names)
            diff = subprocess.run([REPRO, "diff", a, b], capture_output=True, text=True)
            self.assertEqual(diff.returncode, 0, diff.stdout + diff.stderr)
            self.assertIn("IDENTICAL", diff.stdout)
            self.assertIn(f"replicas: {b} kept identical parameters and gradient sums on all 2 ranks", diff.stdout)

            faulty = record(self, tmp, program, "faulty", launcher=ranks, REPRO_PERTURB="1:transformer.h.1.mlp:100000",
                            REPRO_PERTURB_RANK="1", **cpu)
            diff = subprocess.run([REPRO, "diff", a, faulty], capture_output=True, text=True)
            self.assertEqual(diff.returncode, 1, diff.stdout + diff.stderr)
            self.assertIn("shown: rank 1", diff.stdout)
            self.assertIn("DIVERGED  first at step 1, tensor `loss` (loss)", diff.stdout)


if __name__ == "__main__":
    unittest.main()
