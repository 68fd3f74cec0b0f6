"""Accelerate with repro's plain API (issue 68, item 3): python/examples/accelerate_mlp.py, an
`Accelerator`'s training recorded by `ModelRecorder` in six added lines, two same-seed runs
IDENTICAL and a fault planted in one module's output at step 1 found there. Skipped where torch
or accelerate is not installed."""

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from recorded_program import check_one_line_callback, example  # noqa: E402  (beside this file)

try:
    import accelerate  # noqa: F401
    import torch  # noqa: F401
except ImportError:  # pragma: no cover
    accelerate = None


@unittest.skipUnless(accelerate is not None, "torch or accelerate is not installed")
class AccelerateTest(unittest.TestCase):
    def test_an_accelerator_is_recorded_by_the_plain_api_and_a_planted_fault_found_at_its_step(self):
        program = example("accelerate_mlp.py")
        added = [line for line in program.splitlines() if line.endswith("# repro")]
        self.assertEqual(len(added), 6, added)  # the import, the recorder, the step, loss, gradients, finish
        names = ("x", "y", "loss", "1", "0.weight", "0.weight.grad", "0.weight.updated")
        check_one_line_callback(self, program, names, "1", "1:1:100000")


if __name__ == "__main__":
    unittest.main()
