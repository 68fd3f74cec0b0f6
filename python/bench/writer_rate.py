"""How fast the Python trace writer stores full values: steps of large tensors written with
`capture="all"` (each tensor hashed, its bytes streamed into the step's safetensors payload and
synced before the step record), timed per step. No GPU and no torch needed.

    python python/bench/writer_rate.py [DIR] [MIB_PER_STEP] [STEPS]

DIR (default: a temporary folder) should be on the disk traces go to: the rate includes its
writes and syncs. Prints one markdown row: the median step's rate and the slowest step's.
"""

import os
import statistics
import sys
import tempfile
import time

from repro.writer import Record, TraceWriter


def main() -> None:
    folder = sys.argv[1] if len(sys.argv) > 1 else None
    mib = int(sys.argv[2]) if len(sys.argv) > 2 else 512
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 5
    tensors = max(1, mib // 64)
    block = os.urandom((mib << 20) // tensors)
    with tempfile.TemporaryDirectory(dir=folder) as d:
        w = TraceWriter(os.path.join(d, "trace"), {"workload": "writer-rate", "steps": steps}, capture="all")
        rates = []
        for step in range(steps):
            records = [Record(f"t{i}", "weight", "U8", [len(block)], block) for i in range(tensors)]
            started = time.perf_counter()
            w.write_step(step, records)
            rates.append(tensors * len(block) / (time.perf_counter() - started) / 2**30)
        w.finish()
    print("| full values a step | steps | median rate | slowest step |")
    print("|---|---|---|---|")
    print(f"| {mib} MiB ({tensors} tensors) | {steps} | {statistics.median(rates):.2f} GiB/s | {min(rates):.2f} GiB/s |")


if __name__ == "__main__":
    main()
