"""How fast the host computes the leaves of the data hash `xxh3-1k` (docs/trace-format.md,
section 5.5): a call of xxhash a 1024-byte chunk (`repro.trace.xxh3_1k_leaves`, what the reader
and the writer use), against XXH3-64 computed over every chunk at once in numpy's 64-bit lanes.

XXH3-64 of exactly 1024 bytes takes xxHash's long path: eight 64-bit accumulators, set to
XXH3_INIT_ACC, take 15 stripes of 64 bytes with the secret at 8 bytes a stripe, then the last
stripe (bytes 960 to 1024) with the secret at byte 121 (no scramble: 1024 bytes are no whole
block), then merge with the secret at byte 11 from 1024 * PRIME64_1, and avalanche. Each lane
of a stripe adds its word to its neighbour's accumulator, and the product of the low and high
halves of the word XOR the secret to its own; a merge folds the 128-bit product of two words
(split into 32-bit halves here: numpy has no 128-bit multiply). The numpy leaves are checked
against xxhash's (random, all-zero and all-0xFF chunks) before anything is timed.

Over 256 MB on the 2-core build machine (AMD EPYC): xxhash a chunk 6.1 GB/s, numpy 3.4 GB/s at
its best block (1024 chunks; 1.4 at 4096), 3.3 on both cores. On an H200 machine's 16-core Xeon:
3.7 against 1.6 GB/s, 1.4 on 16 threads (numpy's many short operations contend for Python's
lock). So repro.trace's leaves are xxhash's, a chunk at a time.

    python python/bench/xxh3_leaf_cpu_rate.py [MB]      # default: 256
"""

import os
import struct
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import blake3
import numpy as np
import xxhash

from repro.trace import XXH3_CHUNK, xxh3_1k_leaves

# XXH3's default secret (192 bytes) and its constants.
SECRET = bytes.fromhex(
    "b8fe6c3923a44bbe7c01812cf721ad1cded46de9839097db7240a4a4b7b3671fcb79e64eccc0e578825ad07dccff7221"
    "b8084674f743248ee03590e6813a264c3c2852bb91c300cb88d0658b1b532ea371644897a20df94e3819ef46a9deacd8"
    "a8fa763fe39c343ff9dcbbc7c70b4f1d8a51e04bcdb45931c89f7ec9d9787364eac5ac8334d3ebc3c581a0fffa1363eb"
    "170ddd51b7f0da49d316552629d4689e2b16be587d47a1fc8ff8b8d17ad031ce45cb3a8f95160428afd7fbcabb4b407e"
)
PRIME32 = (0x9E3779B1, 0x85EBCA77, 0xC2B2AE3D)
PRIME64 = (0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0x85EBCA77C2B2AE63, 0x27D4EB2F165667C5)
INIT_ACC = np.array([PRIME32[2], PRIME64[0], PRIME64[1], PRIME64[2], PRIME64[3], PRIME32[1], PRIME64[4], PRIME32[0]],
                    np.uint64)
WORDS = XXH3_CHUNK // 8  # 64-bit words a chunk: 16 stripes of 8 lanes


def _secret_words(offset: int, count: int) -> list:
    return list(struct.unpack_from(f"<{count}Q", SECRET, offset))


# The secret's word for each word of a chunk: stripe s at byte 8s, the last stripe at byte 121.
STRIPE_KEYS = np.array(sum((_secret_words(8 * s, 8) for s in range(15)), []) + _secret_words(121, 8), np.uint64)
MERGE_KEYS = np.array(_secret_words(11, 8), np.uint64)
MERGE_START = np.uint64(XXH3_CHUNK * PRIME64[0] % 2**64)
LOW32, SHIFT32 = np.uint64(0xFFFFFFFF), np.uint64(32)


def _mul128_fold64(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The low 64 bits XOR the high 64 bits of each 128-bit product a * b, from 32-bit halves."""
    a0, a1, b0, b1 = a & LOW32, a >> SHIFT32, b & LOW32, b >> SHIFT32
    low_low, high_low, low_high, high_high = a0 * b0, a1 * b0, a0 * b1, a1 * b1
    cross = (low_low >> SHIFT32) + (high_low & LOW32) + low_high  # below 2**64: no carry lost
    upper = (high_low >> SHIFT32) + (cross >> SHIFT32) + high_high
    lower = (cross << SHIFT32) | (low_low & LOW32)
    return lower ^ upper


def xxh3_64_of_chunks(words: np.ndarray) -> np.ndarray:
    """XXH3-64 of each row of `words`, a (chunks, 128) array of a chunk's little-endian words."""
    chunks = words.shape[0]
    key = words ^ STRIPE_KEYS
    high = key >> SHIFT32
    key &= LOW32
    key *= high  # each lane's product, added to its own accumulator
    flat, data = key.reshape(-1), words.reshape(-1)
    flat[0::2] += data[1::2]  # each lane's word, added to its neighbour's
    flat[1::2] += data[0::2]
    acc = np.einsum("csl->cl", key.reshape(chunks, 16, 8)) + INIT_ACC  # summed over the 16 stripes
    acc ^= MERGE_KEYS
    h = MERGE_START + _mul128_fold64(acc[:, 0::2], acc[:, 1::2]).sum(axis=1, dtype=np.uint64)
    h ^= h >> np.uint64(37)
    h *= np.uint64(0x165667919E3779F9)
    h ^= h >> SHIFT32
    return h


def numpy_leaves(data: bytes, block_chunks: int = 1024, pool=None) -> bytes:
    """`repro.trace.xxh3_1k_leaves` in numpy, `block_chunks` chunks at a time (on `pool`'s threads)."""
    whole = len(data) // XXH3_CHUNK
    words = np.frombuffer(data, "<u8", count=whole * WORDS).reshape(whole, WORDS)
    blocks = [words[at : at + block_chunks] for at in range(0, whole, block_chunks)]
    leaves = list((pool.map if pool is not None else map)(xxh3_64_of_chunks, blocks))
    if len(data) % XXH3_CHUNK:
        tail = bytes(data[whole * XXH3_CHUNK :]).ljust(XXH3_CHUNK, b"\0")
        leaves.append(xxh3_64_of_chunks(np.frombuffer(tail, "<u8").reshape(1, WORDS)))
    return np.concatenate(leaves).astype("<u8").tobytes() if leaves else b""


def check() -> None:
    """The numpy leaves against xxhash's: random chunks, and all-zero and all-0xFF ones (the
    lanes' products and sums at their extremes), whole and with a zero-padded tail."""
    rng = np.random.default_rng(46)
    data = rng.bytes(XXH3_CHUNK * 3000) + bytes(XXH3_CHUNK) + b"\xff" * XXH3_CHUNK + rng.bytes(XXH3_CHUNK * 40)
    words = np.frombuffer(data, "<u8").reshape(-1, WORDS)
    expected = [xxhash.xxh3_64_intdigest(data[at : at + XXH3_CHUNK]) for at in range(0, len(data), XXH3_CHUNK)]
    if xxh3_64_of_chunks(words).tolist() != expected:
        sys.exit("numpy's XXH3-64 differs from xxhash's")
    for length in (0, 1, 1023, 1025, len(data) - 5):
        if numpy_leaves(data[:length], block_chunks=7) != xxh3_1k_leaves(data[:length]):
            sys.exit(f"numpy's leaves of {length} bytes differ from repro.trace's")


def rate(hash_bytes, data: bytes) -> float:
    """MB/s of the fastest of three runs."""
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        hash_bytes(data)
        best = min(best, time.perf_counter() - started)
    return len(data) / best / 1e6


def main() -> None:
    check()
    megabytes = int(sys.argv[1]) if len(sys.argv) > 1 else 256
    data = np.random.default_rng(0).bytes(megabytes * 10**6)
    print(f"leaves of {megabytes} MB: MB/s")
    print(f"  xxhash a chunk (repro.trace)  {rate(xxh3_1k_leaves, data):8.0f}")
    for block_chunks in (256, 1024, 4096):
        mb_s = rate(lambda d: numpy_leaves(d, block_chunks), data)
        print(f"  numpy, {block_chunks:4d} chunks a block    {mb_s:8.0f}")
    with ThreadPoolExecutor(os.cpu_count()) as pool:
        mb_s = rate(lambda d: numpy_leaves(d, 1024, pool), data)
        print(f"  numpy, 1024, {os.cpu_count():3d} threads     {mb_s:8.0f}")
    print(f"  (BLAKE3 of the bytes, 1 thread {rate(lambda d: blake3.blake3(d).digest(), data):8.0f})")


if __name__ == "__main__":
    main()
