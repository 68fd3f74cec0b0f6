"""python/examples/torch_ddp.py with rank 1 killed (SIGKILL, no cleanup) after its step 1, for
the test that a rank that dies leaves its run INCOMPLETE (test_torch_ranks.py)."""

import os
import signal
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))

from torch_ddp import main  # noqa: E402


def kill_rank_1_after_step_1(rank: int, step: int) -> None:
    if (rank, step) == (1, 1):
        os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    main(sys.argv[1:], after_step=kill_rank_1_after_step_1)
