"""Hashing CUDA tensors where they are, with repro's own batched BLAKE3 kernels
(`librepro_cuda_hash.so`, built by `make cuda`): finding the library, and queueing a step's
tensors and reading their hashes back a step later."""

from __future__ import annotations

import ctypes
import os
import shutil
from typing import Optional

import torch

from repro_writer import Record, WriteError

CUDA_HASH_LIB_ENV = "REPRO_CUDA_HASH_LIB"
CUDA_HASH_LIB = "librepro_cuda_hash.so"


def cuda_hash_library_path() -> Optional[str]:
    """Where repro's GPU hashing library is: REPRO_CUDA_HASH_LIB, else beside the `repro` on
    PATH (in its folder or its `examples/`, where `make cuda` builds it); None if nowhere."""
    path = os.environ.get(CUDA_HASH_LIB_ENV)
    if path:
        if not os.path.isfile(path):
            raise WriteError(f"{CUDA_HASH_LIB_ENV}={path}: no such file (build it with `make cuda`)")
        return path
    repro = shutil.which("repro")
    if repro:
        folder = os.path.dirname(os.path.realpath(repro))
        for candidate in (os.path.join(folder, CUDA_HASH_LIB), os.path.join(folder, "examples", CUDA_HASH_LIB)):
            if os.path.isfile(candidate):
                return candidate
    return None


_LOADED: dict = {}


def _cuda_hash_library(path: str) -> ctypes.CDLL:
    if path not in _LOADED:
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            raise WriteError(f"cannot load repro's GPU hashing library {path}: {e}") from None
        lib.repro_cuda_hasher_new.restype = ctypes.c_void_p
        lib.repro_cuda_hasher_new.argtypes = [ctypes.c_int32]
        lib.repro_cuda_hasher_push.restype = ctypes.c_int64
        lib.repro_cuda_hasher_push.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_int32]
        lib.repro_cuda_hasher_flush.restype = ctypes.c_int32
        lib.repro_cuda_hasher_flush.argtypes = [ctypes.c_void_p]
        lib.repro_cuda_hasher_start_read.restype = ctypes.c_void_p
        lib.repro_cuda_hasher_start_read.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint64)]
        lib.repro_cuda_read_finish.restype = ctypes.c_int32
        lib.repro_cuda_read_finish.argtypes = [
            ctypes.c_void_p, ctypes.c_char_p, ctypes.c_uint64, ctypes.c_char_p, ctypes.c_uint64,
        ]
        lib.repro_cuda_hasher_free.restype = None
        lib.repro_cuda_hasher_free.argtypes = [ctypes.c_void_p]
        lib.repro_cuda_last_error.restype = ctypes.c_char_p
        _LOADED[path] = lib
    return _LOADED[path]


class DeviceHasher:
    """repro's batched BLAKE3 kernels over one GPU's tensors, in place (librepro_cuda_hash.so).

    `queue` takes a record and its canonical bytes on the GPU; `flush` launches the kernels over
    what is queued without waiting; `start_read` queues the copy of a step's hashes to the host,
    and the `DeviceRead` it returns fills each record's `data_hash` (and `data`, for those queued
    with `keep_bytes`) when finished, a step later, so the GPU never waits for the host. The
    kernels run on CUDA's per-thread default stream, which CUDA orders both ways with the legacy
    default stream that PyTorch uses unless told otherwise: once flushed, a tensor may be freed
    or changed in place by what the program does next. On another stream, `flush` synchronizes
    it first and finishes the read at once."""

    def __init__(self, path: str, index: int):
        self._lib = _cuda_hash_library(path)
        self.index = index
        self._handle = self._lib.repro_cuda_hasher_new(index)
        if not self._handle:
            raise WriteError(_last_error(self._lib))
        self._queued: list = []  # (record, bytes on the GPU, keep_bytes) until flushed
        self._flushed: list = []  # (record, length kept or None) until read

    def queue(self, record: Record, flat: torch.Tensor, keep_bytes: bool) -> None:
        if self._lib.repro_cuda_hasher_push(self._handle, flat.data_ptr(), flat.numel(), int(keep_bytes)) < 0:
            raise WriteError(_last_error(self._lib))
        self._queued.append((record, flat, keep_bytes))

    def flush(self) -> None:
        if not self._queued:
            return
        stream = torch.cuda.current_stream(self.index)
        legacy = stream.cuda_stream == 0
        if not legacy:
            stream.synchronize()
        if self._lib.repro_cuda_hasher_flush(self._handle) != 0:
            raise WriteError(_last_error(self._lib))
        self._flushed.extend((record, flat.numel() if keep else None) for record, flat, keep in self._queued)
        self._queued = []  # the tensors may go: what reuses their memory waits for the kernels
        if not legacy:
            self.start_read().finish()

    def start_read(self) -> "DeviceRead":
        """Flushes, and starts copying the hashes of everything flushed to the host."""
        self.flush()
        n = ctypes.c_uint64(0)
        handle = self._lib.repro_cuda_hasher_start_read(self._handle, ctypes.byref(n))
        records, self._flushed = self._flushed, []
        if not handle:
            raise WriteError(_last_error(self._lib))
        if n.value != len(records):
            raise WriteError(f"the GPU hasher holds {n.value} tensors, {len(records)} were queued")
        return DeviceRead(self._lib, handle, records)

    def close(self) -> None:
        if self._handle:
            self._lib.repro_cuda_hasher_free(self._handle)
            self._handle = None

    def __del__(self):
        self.close()


class DeviceRead:
    """A step's hashes on their way from the GPU (see `DeviceHasher.start_read`)."""

    def __init__(self, lib, handle, records: list):
        self._lib, self._handle, self._records = lib, handle, records

    def finish(self) -> None:
        """Waits for the copy (this step's work only) and fills the records."""
        if self._handle is None:
            return
        handle, self._handle = self._handle, None
        n = len(self._records)
        kept = sum(length or 0 for _, length in self._records)
        hashes, values = ctypes.create_string_buffer(max(32 * n, 1)), ctypes.create_string_buffer(max(kept, 1))
        if self._lib.repro_cuda_read_finish(handle, hashes, n, values, kept) != 0:
            raise WriteError(_last_error(self._lib))
        at, raw, kept_raw = 0, hashes.raw, values.raw
        for i, (record, length) in enumerate(self._records):
            record.data_hash = raw[32 * i : 32 * i + 32]
            if length is not None:
                record.data = kept_raw[at : at + length]
                at += length

    def __del__(self):
        try:
            self.finish()
        except WriteError:
            pass


def _last_error(lib) -> str:
    message = lib.repro_cuda_last_error()
    return message.decode(errors="replace") if message else "unknown error"

