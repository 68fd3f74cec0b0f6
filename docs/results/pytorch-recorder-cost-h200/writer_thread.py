"""Experiment: every step written on the recorder's writer thread (as a step of full values is),
the records packed natively, so that the writing's Python competes less with the training
thread. Runs python/bench/torch_profile.py with the recorder so patched."""
import runpy
import sys
from concurrent.futures import ThreadPoolExecutor

import repro_torch.recorder as r


def _write_oldest(self):
    s, reads = self._behind.pop(0)
    for read in reads:
        read.finish()
    s.fill_repeats()
    self._wait_for_writing()
    if self._full_writer is None:
        self._full_writer = ThreadPoolExecutor(1, thread_name_prefix="repro-writer")
    self._writing = (s.step, self._full_writer.submit(self._writer.write_laid_out, s.step, s.layouts, s.data,
                                                      s.hashes, s.no_gradient))


r.Recorder._write_oldest = _write_oldest
sys.argv = ["torch_profile.py"] + sys.argv[1:]
runpy.run_path("python/bench/torch_profile.py", run_name="__main__")
