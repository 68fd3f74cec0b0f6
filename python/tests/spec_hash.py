"""The canonical tensor hash as docs/trace-format.md writes it in Python (sections 5.2 and 5.5),
kept as the specification has it: the reference the tests check the reader's and the writer's
hashes against, independent of repro.trace."""

import struct

import blake3


def data_hash_xxh3_1k(data: bytes) -> bytes:
    import xxhash

    leaves = bytearray()
    for at in range(0, len(data), 1024):
        chunk = data[at:at + 1024].ljust(1024, b"\0")
        leaves += struct.pack("<Q", xxhash.xxh3_64_intdigest(chunk))
    return blake3.blake3(bytes(leaves)).digest()


def tensor_hash(dtype: str, shape: list, data: bytes, data_hash: str = "blake3") -> str:
    """Section 5.2's `tensor_hash`, its inner hash that of the trace's data hash."""
    inner = {"blake3": lambda d: blake3.blake3(d).digest(), "xxh3-1k": data_hash_xxh3_1k}[data_hash](data)
    outer = blake3.blake3()
    outer.update(b"repro.tensor.v1")
    outer.update(bytes([len(dtype)]) + dtype.encode("ascii"))
    outer.update(struct.pack("<Q", len(shape)))
    for d in shape:
        outer.update(struct.pack("<Q", d))
    outer.update(inner)
    return outer.hexdigest()
