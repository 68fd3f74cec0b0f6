"""A record file (docs/trace-format.md, section 2) taken apart into its frames and put back, for
tests that change a record the way a damaged or foreign file would."""

import struct
import zlib

import msgpack


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


def rewrite_header(path: str, preamble: bytes, frames: list, version: tuple, change=None) -> None:
    """The record file `preamble` and `frames` (`frames_of`) written to `path` with its header
    declaring format `version` (major, minor) in the preamble and the header alike, and changed
    by `change(header)` where given."""
    header = msgpack.unpackb(frames[0], raw=False)
    header["format"] = {"major": version[0], "minor": version[1]}
    if change is not None:
        change(header)
    write_frames(path, preamble[:8] + struct.pack("<HH", *version), [msgpack.packb(header, use_bin_type=True), *frames[1:]])
