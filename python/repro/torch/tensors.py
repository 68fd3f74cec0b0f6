"""A tensor's canonical form as the trace stores it (docs/trace-format.md, section 5): its
dtype name, shape, and row-major little-endian element bytes; `bool` recorded as `U8`."""

from __future__ import annotations

import sys

import torch

from repro.writer import Record, WriteError

_DTYPES = {
    torch.uint8: "U8", torch.int16: "I16", torch.int32: "I32", torch.int64: "I64",
    torch.float16: "F16", torch.bfloat16: "BF16", torch.float32: "F32", torch.float64: "F64",
}
if hasattr(torch, "uint32"):
    _DTYPES[torch.uint32] = "U32"
# The floating-point and integer dtypes a trace holds as they are (every recordable one but `bool`).
NUMBER_DTYPES = frozenset(_DTYPES)
INT_OF_WIDTH = {2: torch.int16, 4: torch.int32, 8: torch.int64}
# The dtypes whose memory, when contiguous, holds their canonical bytes as it is (`bool` as bytes
# 0 and 1, as `U8`), on a little-endian host; none on another.
IN_PLACE_DTYPES = {**_DTYPES, torch.bool: "U8"} if sys.byteorder == "little" else {}


def canonical_on_device(t: torch.Tensor) -> tuple[str, tuple[int, ...], torch.Tensor]:
    """A tensor's trace dtype, shape and canonical element bytes as a flat `uint8` tensor where
    the tensor lives (row-major; little-endian, as every device PyTorch runs on)."""
    t = t.detach()
    if t.dtype == torch.bool:
        t = t.to(torch.uint8)
    dtype = _DTYPES.get(t.dtype)
    if dtype is None:
        raise WriteError(f"cannot record tensors of dtype {t.dtype}")
    if sys.byteorder != "little":  # pragma: no cover
        raise WriteError("the canonical bytes are little-endian; this host is not")
    flat = t.contiguous().reshape(-1)
    return dtype, tuple(t.shape), flat.view(torch.uint8) if flat.numel() else flat.new_empty(0, dtype=torch.uint8)


def canonical(t: torch.Tensor) -> tuple[str, tuple[int, ...], bytes]:
    """A tensor's trace dtype, shape and canonical element bytes (row-major, little-endian)."""
    dtype, shape, flat = canonical_on_device(t)
    return dtype, shape, flat.cpu().numpy().tobytes() if flat.numel() else b""


def record_of(name: str, kind: str, t: torch.Tensor, **what) -> Record:
    """The record of `t` under `name`, its bytes copied to the host (`what`: the record's other fields)."""
    dtype, shape, data = canonical(t)
    return Record(name, kind, dtype, shape, data, **what)

