"""What one flush of repro's GPU hashing library costs the host, by the size of the tensor it
hashes: `DeviceHasher.queue` then `flush` of one CUDA tensor, timed on the host (the GPU is not
waited for), the median of many. A flush launches the kernels that read the tensor (the chunk
pass) and those that build the BLAKE3 tree above it, a launch per level, so its host time grows
with the tensor's size even though nothing waits for the GPU.

    python python/bench/torch_flush_cost.py [REPEATS]

Needs CUDA and repro's GPU hashing library (REPRO_CUDA_HASH_LIB).
"""

import statistics
import sys
import time

import torch

from repro.torch import DeviceHasher, cuda_hash_library_path


class OneRecord:
    """A step of one record, as the hasher fills it (see `DeviceHasher.queue`)."""

    def __init__(self):
        self.data, self.hashes = [None], [None]

    def name_of(self, index: int) -> str:
        return "t"


def main() -> None:
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    library = cuda_hash_library_path()
    if not torch.cuda.is_available() or library is None:
        raise SystemExit("torch_flush_cost.py needs a CUDA GPU and repro's GPU hashing library (REPRO_CUDA_HASH_LIB)")
    hasher = DeviceHasher(library, torch.cuda.current_device())
    print("| tensor | host time of a flush (median) | BLAKE3 tree levels above its chunks |")
    print("|---|---|---|")
    for size in (4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20, 256 << 20):
        t = torch.ones(size // 4, device="cuda")
        record = OneRecord()
        times = []
        for i in range(repeats):
            started = time.perf_counter()
            hasher.queue(record, 0, t.data_ptr(), size, False, t, t._version)
            hasher.flush()
            times.append(time.perf_counter() - started)
            if i % 20 == 19:
                hasher.start_read().finish()  # lets the results go, as a step's end does
        hasher.start_read().finish()
        chunks = size // 1024
        print(f"| {size / 2**20:g} MiB | {statistics.median(times) * 1e6:.1f} us | {max(chunks - 1, 0).bit_length()} |")
    hasher.close()
    from repro.torch import cuda_hash

    for what, call in (("torch.cuda.current_stream(0).cuda_stream", cuda_hash._current_stream_handle),
                       ("the raw stream the library asks for", cuda_hash._raw_stream)):
        started = time.perf_counter()
        for _ in range(10000):
            call(0)
        print(f"{what}: {(time.perf_counter() - started) / 10000 * 1e6:.2f} us a call")


if __name__ == "__main__":
    main()
