"""python/examples/torch_ddp.py with rank 1 hanging (asleep, never reaching step 2's gradient sum)
after its step 1, for the test that `repro record --timeout` ends every rank and names the one
that never arrived (test_torch_ranks.py)."""

import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))

from torch_ddp import main  # noqa: E402


def hang_rank_1_after_step_1(rank: int, step: int) -> None:
    if (rank, step) == (1, 1):
        time.sleep(3600)


if __name__ == "__main__":
    main(sys.argv[1:], after_step=hang_rank_1_after_step_1)
