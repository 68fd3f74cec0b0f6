"""The Python writer's own time per record at a step of hashes only: `TraceWriter.write_laid_out`
over 1,500 records laid out as a CNN's module outputs (each given its 32-byte data hash, as the
GPU path gives them), the best of 37 steps after 3, in microseconds a record.

    python python/bench/writer_records.py [RECORDS]
"""

import os
import sys
import tempfile
import time

from repro.writer import TraceWriter


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1500
    layouts = [(f"features.block{i}.conv", "op_output", "F32", (64, 32, 28, 28), "forward", (), i,
                "torchvision/models/densenet.py:49", None, None, None) for i in range(n)]
    hashes = [bytes([i % 256]) * 32 for i in range(n)]
    with tempfile.TemporaryDirectory() as d:
        writer = TraceWriter(os.path.join(d, "t"), {"workload": "writer-records"}, "none")
        best = float("inf")
        for step in range(40):
            started = time.perf_counter()
            writer.write_laid_out(step, layouts, [None] * n, hashes)
            if step >= 3:
                best = min(best, time.perf_counter() - started)
        writer.finish()
    print(f"write_laid_out: {best / n * 1e6:.2f} us a record ({n} records, best of 37 steps)")


if __name__ == "__main__":
    main()
