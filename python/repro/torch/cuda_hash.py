"""Hashing CUDA tensors where they are, with repro's own batched kernels of each data hash
(`librepro_cuda_hash.so`, built by `make cuda`): finding the library, and queueing a step's
tensors and reading their hashes back a step later."""

from __future__ import annotations

import array
import ctypes
import operator
import os
import shutil
from typing import Optional

import torch

from repro.trace import BLAKE3, XXH3_1K
from repro.writer import WriteError

CUDA_HASH_LIB_ENV = "REPRO_CUDA_HASH_LIB"
CUDA_HASH_LIB = "librepro_cuda_hash.so"
# The library's number for each data hash (`repro_cuda_hasher_new_kind`); a library without that
# function hashes with BLAKE3 only.
LIBRARY_DATA_HASHES = {BLAKE3: 0, XXH3_1K: 1}


def cuda_hash_library_path() -> Optional[str]:
    """Where repro's native library is: REPRO_CUDA_HASH_LIB, else beside the `repro` on PATH (in
    its folder, where `make cuda` builds it), else the extension module `repro._native` that the
    wheel installs (`make wheel`); None if nowhere."""
    path = os.environ.get(CUDA_HASH_LIB_ENV)
    if path:
        if not os.path.isfile(path):
            raise WriteError(f"{CUDA_HASH_LIB_ENV}={path}: no such file (build it with `make cuda`)")
        return path
    repro = shutil.which("repro")
    if repro:
        candidate = os.path.join(os.path.dirname(os.path.realpath(repro)), CUDA_HASH_LIB)
        if os.path.isfile(candidate):
            return candidate
    try:
        from repro import _native
    except ImportError:
        return None
    return _native.__file__


def library_hashes_on_gpu(path: str) -> bool:
    """Whether the library at `path` hashes on a GPU: built by `make cuda`, not the workspace's
    CPU build (which has only the packing of records, python/cuda-hash/src/records.rs)."""
    try:
        return hasattr(ctypes.CDLL(path), "repro_cuda_hasher_new")
    except OSError as e:
        raise WriteError(f"cannot load repro's GPU hashing library {path}: {e}") from None


_LOADED: dict = {}


def _cuda_hash_library(path: str) -> ctypes.CDLL:
    if path not in _LOADED:
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            raise WriteError(f"cannot load repro's GPU hashing library {path}: {e}") from None
        lib.repro_cuda_hasher_new.restype = ctypes.c_void_p
        lib.repro_cuda_hasher_new.argtypes = [ctypes.c_int32]
        if hasattr(lib, "repro_cuda_hasher_new_kind"):  # not in a library built before format 2.0
            lib.repro_cuda_hasher_new_kind.restype = ctypes.c_void_p
            lib.repro_cuda_hasher_new_kind.argtypes = [ctypes.c_int32, ctypes.c_uint32]
        if hasattr(lib, "repro_cuda_hasher_push_now"):
            lib.repro_cuda_hasher_push_now.restype = ctypes.c_int64
            lib.repro_cuda_hasher_push_now.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint64]
        lib.repro_cuda_hasher_push_many.restype = ctypes.c_int64
        lib.repro_cuda_hasher_push_many.argtypes = [
            ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint64),
            ctypes.POINTER(ctypes.c_uint8), ctypes.c_uint64,
        ]
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
    """repro's batched kernels of a data hash (`blake3` or `xxh3-1k`, a trace's) over one GPU's
    tensors, in place (librepro_cuda_hash.so).

    `queue` takes a record, by its step's lists and its index in them (an `owner` with `data`
    and `hashes` lists and `name_of(index)`), and the address and length of its canonical bytes
    on the GPU; `flush` launches the kernels over what is queued without waiting; `start_read`
    queues the copy of a step's hashes to the host, and the `DeviceRead` it returns fills each
    record's hash (and bytes, for those queued with `keep_bytes`) when finished, a step later, so
    the GPU never waits for the host.

    A flush reads the memory on CUDA's per-thread default stream, which CUDA orders both ways
    with the legacy default stream that PyTorch uses unless told otherwise: once flushed, a
    tensor may be freed or changed in place by what the program does next. The hasher holds
    each tensor until it is flushed, and checks then that its version counter has not moved (a
    tensor changed in place before it was read is an error, never a wrong hash). On a stream other than the legacy one, `flush` synchronizes it first, reads in order, and
    finishes the read at once.

    Under `xxh3-1k`, `queue_now` reads a tensor at once instead (the library's leaf pass, in
    order with the legacy stream), so that the program may change it in place right after,
    without a copy; its hash comes with the next flush's."""

    def __init__(self, path: str, index: int, lib=None, data_hash: str = BLAKE3):
        """`lib`: the library's functions, when not loaded from `path` (a test's stand-in);
        `data_hash`: the trace's, which the hashes are computed with."""
        self._handle = None  # none to free (`close`) until the library makes one
        if data_hash not in LIBRARY_DATA_HASHES:
            raise WriteError(f"data hash {data_hash!r} is not one of {', '.join(LIBRARY_DATA_HASHES)}")
        self._lib = lib if lib is not None else _cuda_hash_library(path)
        self.index = index
        self.data_hash = data_hash
        if data_hash == BLAKE3:  # as every library hashes, whatever its age
            self._handle = self._lib.repro_cuda_hasher_new(index)
        else:
            new_kind = getattr(self._lib, "repro_cuda_hasher_new_kind", None)
            if new_kind is None:
                raise WriteError(f"repro's GPU hashing library {path} is older than the data hash {data_hash} needs "
                                 "(it hashes with blake3 only): rebuild it with `make cuda`")
            self._handle = new_kind(index, LIBRARY_DATA_HASHES[data_hash])
        if not self._handle:
            raise WriteError(_last_error(self._lib))
        # Queued until flushed, in flat lists (no object per record for the garbage collector to
        # walk): each record's owner and index, the tensor read for it, that tensor's version
        # when it is the program's own, and the three arrays `push_many` takes.
        self._owners: list = []
        self._indices: list[int] = []
        self._held: list = []
        self._versions: list = []
        self._addresses: list[int] = []
        self._lengths: list[int] = []
        self._keeps = bytearray()
        # Of the records queued, how many the library holds already (`queue_now` pushes those
        # before it, to keep the tickets in order).
        self._pushed = 0
        # Whether `queue_now` may read at once: the library can, for this data hash.
        self.reads_now = data_hash == XXH3_1K and hasattr(self._lib, "repro_cuda_hasher_push_now")
        # Flushed until read: each record's owner and index, and the length of its bytes kept.
        self._flushed_owners: list = []
        self._flushed_indices: list[int] = []
        self._flushed_kept: list = []

    def queue(self, owner, index: int, address: int, length: int, keep_bytes: bool, held: torch.Tensor,
              version: Optional[int]) -> None:
        """Queues `length` bytes at `address` (the canonical bytes of `held`, a tensor the hasher
        keeps alive until they are read) for `owner`'s record `index`; `version`: `held`'s version
        counter now, checked when the bytes are read, or None for a tensor without one (made in
        inference mode)."""
        self._owners.append(owner)
        self._indices.append(index)
        self._held.append(held)
        self._versions.append(version)
        self._addresses.append(address)
        self._lengths.append(length)
        self._keeps.append(1 if keep_bytes else 0)

    def queue_now(self, owner, index: int, address: int, length: int) -> bool:
        """Reads the `length` bytes at `address` at once for `owner`'s record `index`, when
        `reads_now` and the program runs on the legacy default stream (which the read is ordered
        with): then the program may change them right after. Returns whether it did (if not, the
        caller reads a copy)."""
        if not self.reads_now or not self._is_legacy_stream():
            return False
        self._push_queued()
        if self._lib.repro_cuda_hasher_push_now(self._handle, address, length) < 0:
            raise WriteError(_last_error(self._lib))
        # Read already: nothing to hold, nothing to check when the rest is read.
        self.queue(owner, index, address, length, False, _READ_AT_ONCE, None)
        self._pushed += 1
        return True

    def _push_queued(self) -> None:
        """Hands the library the records queued since it was last handed any, in order."""
        n = len(self._indices) - self._pushed
        if n == 0:
            return
        at = self._pushed
        # (Through `array`, whose C loop converts a list of ints about 3 times faster than the
        # constructor of a ctypes array: hundreds of records a step.)
        addresses = (ctypes.c_uint64 * n).from_buffer(array.array("Q", self._addresses[at:]))
        lengths = (ctypes.c_uint64 * n).from_buffer(array.array("Q", self._lengths[at:]))
        keeps = (ctypes.c_uint8 * n).from_buffer(self._keeps, at)
        if self._lib.repro_cuda_hasher_push_many(self._handle, addresses, lengths, keeps, n) < 0:
            raise WriteError(_last_error(self._lib))
        del keeps  # the bytearray may grow again
        self._pushed += n

    def queue_many(self, owner, indices, addresses: list, lengths: list, keeps: bytes, held: list,
                   versions: list) -> None:
        """`queue` of many records of one owner at once (`keeps`: a byte, 1 or 0, for each)."""
        self._owners += [owner] * len(indices)
        self._indices += indices
        self._held += held
        self._versions += versions
        self._addresses += addresses
        self._lengths += lengths
        self._keeps += keeps

    @property
    def queued(self) -> int:
        """Tensors queued and not flushed yet."""
        return len(self._indices)

    def flush(self) -> None:
        """Launches the kernels over what is queued, read in order with the program's stream,
        after checking that none of it changed since it was queued."""
        if not self._indices:
            return
        try:  # every version counter read at once, compared at once
            unchanged = list(map(_VERSION, self._held)) == self._versions
        except RuntimeError:  # a tensor made in inference mode has none
            unchanged = False
        if not unchanged:
            for owner, index, held, version in zip(self._owners, self._indices, self._held, self._versions):
                _check_unchanged(owner, index, held, version)
        legacy = self._on_legacy_stream()
        self._push_queued()
        if self._lib.repro_cuda_hasher_flush(self._handle) != 0:
            raise WriteError(_last_error(self._lib))
        self._flushed_owners += self._owners
        self._flushed_indices += self._indices
        self._flushed_kept += [length if keep else None for length, keep in zip(self._lengths, self._keeps)]
        # Read in order, the tensors may go: what reuses their memory waits for the kernels.
        self._clear_queue()
        if not legacy:
            self.start_read().finish()

    def _clear_queue(self) -> None:
        self._owners, self._indices, self._held, self._versions = [], [], [], []
        self._addresses, self._lengths, self._keeps = [], [], bytearray()
        self._pushed = 0

    def _is_legacy_stream(self) -> bool:
        """Whether the program runs on CUDA's legacy default stream, which the library's reads
        on the calling thread's stream are ordered with."""
        return _raw_stream(self.index) == 0

    def _on_legacy_stream(self) -> bool:
        """Whether the program runs on CUDA's legacy default stream; if not, its stream is
        synchronized (the library's streams are not ordered with it)."""
        if self._is_legacy_stream():
            return True
        torch.cuda.current_stream(self.index).synchronize()
        return False

    def start_read(self) -> "DeviceRead":
        """Flushes, and starts copying the hashes of everything flushed to the host."""
        self.flush()
        n = ctypes.c_uint64(0)
        handle = self._lib.repro_cuda_hasher_start_read(self._handle, ctypes.byref(n))
        owners, indices, kept = self._flushed_owners, self._flushed_indices, self._flushed_kept
        self._flushed_owners, self._flushed_indices, self._flushed_kept = [], [], []
        if not handle:
            raise WriteError(_last_error(self._lib))
        if n.value != len(indices):
            raise WriteError(f"the GPU hasher holds {n.value} tensors, {len(indices)} were queued")
        return DeviceRead(self._lib, handle, owners, indices, kept)

    def abandon(self) -> None:
        """Drops what a failed step queued and lets go of what it flushed, unchecked. (What the
        library holds already, `queue_now`'s and what went before it, is read with the rest and
        dropped too.)"""
        n = self._pushed
        self._flushed_owners += self._owners[:n]
        self._flushed_indices += self._indices[:n]
        self._flushed_kept += [length if keep else None for length, keep in zip(self._lengths[:n], self._keeps[:n])]
        self._clear_queue()
        self.start_read().finish()

    def close(self) -> None:
        if self._handle:
            self._lib.repro_cuda_hasher_free(self._handle)
            self._handle = None

    def __del__(self):
        self.close()


def _current_stream_handle(index: int) -> int:
    """The `cudaStream_t` of the current stream on GPU `index` (0: the legacy default stream)."""
    return torch.cuda.current_stream(index).cuda_stream


# The same, without making a `torch.cuda.Stream` on every flush: PyTorch's own raw accessor (what
# its compiled code calls), where this PyTorch has it.
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) or _current_stream_handle


_VERSION = operator.attrgetter("_version")


class _ReadAtOnce:
    """What the hasher holds for a record `queue_now` read: nothing, and no version to check."""

    _version = None


_READ_AT_ONCE = _ReadAtOnce()


def _check_unchanged(owner, index: int, held: torch.Tensor, version: Optional[int]) -> None:
    """Raises if `held` changed in place since it was queued for `owner`'s record `index` (its
    version counter moved): its hash would be of other values than the ones recorded."""
    if version is not None and held._version != version:
        raise WriteError(
            f"`{owner.name_of(index)}` changed in place after it was recorded, before repro had read it on the GPU "
            "(the steps before did not change it): its hash would not be of the values recorded. "
            "Record with REPRO_TORCH_FLUSH=module (each module's output hashed before the program goes on)"
        )


class DeviceRead:
    """A step's hashes on their way from the GPU (see `DeviceHasher.start_read`)."""

    def __init__(self, lib, handle, owners: list, indices: list, kept: list):
        """The records read, by owner and index (see `DeviceHasher.queue`); `kept`: the length of
        each record's bytes kept, or None."""
        self._lib, self._handle = lib, handle
        self._owners, self._indices, self._kept = owners, indices, kept

    def finish(self) -> None:
        """Waits for the copy (this step's work only) and fills the records."""
        if self._handle is None:
            return
        handle, self._handle = self._handle, None
        n = len(self._indices)
        kept = sum(length or 0 for length in self._kept)
        hashes, values = ctypes.create_string_buffer(max(32 * n, 1)), ctypes.create_string_buffer(max(kept, 1))
        if self._lib.repro_cuda_read_finish(handle, hashes, n, values, kept) != 0:
            raise WriteError(_last_error(self._lib))
        at, raw, kept_raw = 0, hashes.raw, values.raw
        for i, (owner, index, length) in enumerate(zip(self._owners, self._indices, self._kept)):
            owner.hashes[index] = raw[32 * i : 32 * i + 32]
            if length is not None:
                owner.data[index] = kept_raw[at : at + length]
                at += length

    def __del__(self):
        try:
            self.finish()
        except WriteError:
            pass


def _last_error(lib) -> str:
    message = lib.repro_cuda_last_error()
    return message.decode(errors="replace") if message else "unknown error"

