"""A record file (docs/trace-format.md, section 2) taken apart into its frames and put back, for
tests that change a record the way a damaged or foreign file would."""

import struct
import zlib


def frames_of(path: str) -> tuple[bytes, list]:
    """A record file's preamble and its frames' payloads."""
    with open(path, "rb") as f:
        raw = f.read()
    at, frames = 12, []
    while at < len(raw):
        length = struct.unpack_from("<I", raw, at)[0]
        frames.append(raw[at + 8:at + 8 + length])
        at += 8 + length
    return raw[:12], frames


def write_frames(path: str, preamble: bytes, frames: list) -> None:
    """A record file of `frames`' payloads, each framed with its length and checksum."""
    with open(path, "wb") as f:
        f.write(preamble)
        for payload in frames:
            length = struct.pack("<I", len(payload))
            f.write(length + struct.pack("<I", zlib.crc32(payload, zlib.crc32(length)) & 0xFFFFFFFF) + payload)
