"""The GPU hashing library's data hashes checked against the host's, and their rates: pieces of
CUDA memory of many lengths and alignments hashed with `blake3` and `xxh3-1k` by repro's GPU
library (`DeviceHasher`), compared with the same bytes hashed on the host by the Python reader's
functions (`repro.trace.data_hasher`); then the rate of each data hash over large tensors, the
whole library's way (a flush, the copy back, the read finished).

    python python/bench/torch_data_hash_check.py [GIB ...]

GIB: sizes of the tensors timed (default 1 and 4). Needs CUDA and REPRO_CUDA_HASH_LIB. Prints
the mismatches (there should be none) and a markdown table of rates; exits 1 on a mismatch.
"""

import sys
import time

import torch

from repro.torch.cuda_hash import DeviceHasher, cuda_hash_library_path
from repro.trace import BLAKE3, XXH3_1K, data_hasher

KINDS = (BLAKE3, XXH3_1K)


class Owner:
    """What `DeviceHasher` fills: a record's hash and, when kept, its bytes."""

    def __init__(self, n: int):
        self.hashes, self.data = [None] * n, [None] * n

    def name_of(self, index: int) -> str:
        return f"piece {index}"


def hasher_of(kind: str) -> DeviceHasher:
    return DeviceHasher(cuda_hash_library_path(), 0, data_hash=kind)


def hashed_on_gpu(hasher: DeviceHasher, pieces: list, keep: list) -> Owner:
    """Each piece (a uint8 CUDA tensor) hashed by the library in one flush; `keep`: its bytes too."""
    owner = Owner(len(pieces))
    for i, (piece, kept) in enumerate(zip(pieces, keep)):
        hasher.queue(owner, i, piece.data_ptr(), piece.numel(), kept, piece, None)
    hasher.start_read().finish()
    return owner


def check() -> int:
    """Pieces of every length class at every alignment, each kind: the mismatches."""
    torch.manual_seed(0)
    memory = torch.randint(0, 256, (80 << 20,), dtype=torch.uint8, device="cuda")
    lengths = [1, 3, 8, 63, 64, 65, 1000, 1023, 1024, 1025, 2047, 4096, 5000, (128 << 10) - 1, 128 << 10,
               (128 << 10) + 1, (1 << 20) + 3, (8 << 20) + 17, 64 << 20]
    pieces, keep = [], []
    for offset in (0, 1, 2, 4, 8, 16, 4093):
        for length in lengths:
            pieces.append(memory[offset : offset + length])
            keep.append(length <= 256)
    pieces.append(torch.zeros(3 << 20, dtype=torch.uint8, device="cuda"))
    keep.append(False)
    mismatches = 0
    for kind in KINDS:
        host, hasher = data_hasher(kind), hasher_of(kind)
        # Twice with one hasher: the second flush reuses the first one's leaf memory.
        for attempt in (1, 2):
            owner, equal = hashed_on_gpu(hasher, pieces, keep), 0
            for i, piece in enumerate(pieces):
                values = piece.cpu().numpy().tobytes()
                if owner.hashes[i] == host(values) and (not keep[i] or owner.data[i] == values):
                    equal += 1
                else:
                    mismatches += 1
                    print(f"MISMATCH {kind}: {piece.numel()} bytes at offset {piece.storage_offset()}")
            print(f"{kind}, round {attempt}: {len(pieces)} pieces (1 B to 64 MiB, 7 alignments), {equal} equal to the host's")
        hasher.close()
    return mismatches


def rates(sizes: list) -> None:
    """Each kind's rate over one tensor of each size: the median of 5 after one untimed."""
    print("| tensor | blake3 | xxh3-1k | xxh3-1k / blake3 |")
    print("|---|---|---|---|")
    for gib in sizes:
        t = torch.randint(0, 256, (int(gib * 2**30),), dtype=torch.uint8, device="cuda")
        row = {}
        for kind in KINDS:
            hasher, times = hasher_of(kind), []
            for _ in range(6):
                torch.cuda.synchronize()
                started = time.perf_counter()
                hashed_on_gpu(hasher, [t], [False])
                times.append(time.perf_counter() - started)
            hasher.close()
            row[kind] = t.numel() / sorted(times[1:])[2] / 1e9
        print(f"| {gib:g} GiB | {row[BLAKE3]:,.0f} GB/s | {row[XXH3_1K]:,.0f} GB/s | {row[XXH3_1K] / row[BLAKE3]:.2f}x |")
        del t
        torch.cuda.empty_cache()


def main() -> None:
    sizes = [float(a) for a in sys.argv[1:]] or [1.0, 4.0]
    print(torch.cuda.get_device_name(0))
    mismatches = check()
    rates(sizes)
    sys.exit(1 if mismatches else 0)


if __name__ == "__main__":
    main()
