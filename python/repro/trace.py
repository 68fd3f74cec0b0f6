#!/usr/bin/env python3
"""An independent reader of the repro trace format (docs/trace-format.md, formats 1.x and 2.x).

Written from the specification alone, as a second implementation that keeps it honest. It
uses only msgpack, safetensors, blake3 and numpy besides the standard library, and xxhash for
the values of traces whose data hash is `xxh3-1k` (section 5.5).

    PYTHONPATH=python python3 -m repro.trace verify TRACE           # recheck every stored value's hash
    PYTHONPATH=python python3 -m repro.trace diff TRACE_A TRACE_B   # first differing step and tensor

Exit status: 0 all good / identical, 1 hash mismatch / diverged, 2 unreadable trace or usage
(or, for diff, traces of different data hashes, whose hashes cannot be compared).

From Python, `read_tensor(TRACE, STEP, NAME)` gives one stored tensor as a numpy array, and
`Trace.array` each tensor of a step as `Trace.steps` yields it.
"""

from __future__ import annotations

import argparse
import os
import stat
import struct
import sys
import zlib
from dataclasses import dataclass, field
from typing import Iterator, Optional

try:
    import blake3
    import msgpack
    import numpy as np
    import safetensors
except ImportError as _e:  # pragma: no cover
    print(f"repro.trace needs msgpack, safetensors, blake3 and numpy ({_e}); see python/README.md", file=sys.stderr)
    sys.exit(2)

MAGIC = b"RPRTRACE"
PREAMBLE_LEN = 12
FRAME_HEADER_LEN = 8
MAX_RECORD_BYTES = 16 * 1024 * 1024
MAX_NESTING = 32  # a record with this many nested maps/arrays (or more) is corrupt (section 7)
MAX_RANK = 16
MAX_SOURCE_BYTES = 4096  # longest `source` (format 1.4)
U16_MAX = 2**16 - 1
U64_MAX = 2**64 - 1
SUPPORTED_MAJORS = (1, 2)
READER_VERSION = "2.1"
RECORDS_FILE = "records.rpr"
# Where a recorder says what it is doing while it runs (section 10.1); readers of a finished trace
# ignore it.
PROGRESS_FILE = "progress.json"
TENSORS_DIR = "tensors"

DTYPE_SIZES = {"U8": 1, "U32": 4, "I16": 2, "I32": 4, "I64": 8, "F16": 2, "BF16": 2, "F32": 4, "F64": 8}
KINDS = {"weight", "gradient", "prediction", "loss", "activation", "op_output", "input", "buffer", "optimizer_state",
         "rng_state"}
# Kinds newer than 1.0 and 2.0, by the first version of each major line that has them.
KINDS_SINCE = {"buffer": {1: (1, 9), 2: (2, 0)}, "optimizer_state": {1: (1, 10), 2: (2, 1)},
               "rng_state": {1: (1, 10), 2: (2, 1)}}
PHASES = {"forward", "backward", "update"}
# The capture ladder's levels a header's capture policy may name (format 1.9), each a step policy.
CAPTURE_LEVELS = ("modules", "ops")
# The forms of a step policy (`parse_capture`), as messages list them.
STEP_POLICY_FORMS = "none, all, first, first-and-last, every:N, steps:A,B,..."
# Rust's `str::trim` (Unicode White_Space), used around the numbers of `steps:` (section 3.2).
RUST_WHITESPACE = "\t\n\x0b\x0c\r \x85\xa0\u1680" + "".join(map(chr, range(0x2000, 0x200B))) + "\u2028\u2029\u202f\u205f\u3000"


# ---------------------------------------------------------------------------------------------
# Errors


class TraceError(Exception):
    """A trace that cannot be read. `path` is the file at fault, `where` a location in it."""

    kind = "unreadable"

    def __init__(self, path: str, problem: str, where: Optional[str] = None):
        self.path, self.problem, self.where = str(path), problem, where
        loc = f" ({where})" if where else ""
        super().__init__(f"{self.path}{loc}: {self.kind}: {problem}")


class NotATrace(TraceError):
    kind = "not a trace"


class Unsupported(TraceError):
    kind = "unsupported format"


class Corrupt(TraceError):
    kind = "corrupt"


class HashMismatch(Corrupt):
    """Stored values that do not match their recorded canonical hash."""


class _Bad(Exception):
    """A record that does not follow the schema; the caller adds the file and offset."""


# ---------------------------------------------------------------------------------------------
# Canonical hash (section 5)


# How a tensor's data hash is computed from its element bytes (section 5): the header's
# `data_hash` (format 2.0), `blake3` where it has none.
BLAKE3 = "blake3"
XXH3_1K = "xxh3-1k"
DATA_HASHES = (BLAKE3, XXH3_1K)
# The chunk an `xxh3-1k` leaf hashes (section 5.5).
XXH3_CHUNK = 1024


def tensor_hash(dtype: str, shape: list[int], data: bytes, data_hash: str = BLAKE3) -> str:
    """The canonical hash of a tensor's element bytes (section 5), its data hash of the kind
    `data_hash` (a trace's `Trace.data_hash`)."""
    return tensor_hash_of_data_hash(dtype, shape, data_hasher(data_hash)(data))


def data_hasher(data_hash: str):
    """The function that computes a tensor's data hash of the kind `data_hash` (`blake3` or
    `xxh3-1k`) from its element bytes: the inner hash of its canonical hash (sections 5.2, 5.5).
    ValueError for any other kind; ImportError, saying what to install, where the kind needs a
    package that is missing."""
    hasher = _DATA_HASHERS.get(data_hash)
    if hasher is None:
        raise ValueError(f"unknown data hash {data_hash!r} (expected one of {', '.join(DATA_HASHES)})")
    if data_hash == XXH3_1K:
        _xxh3_64()
    return hasher


def blake3_digest(data) -> bytes:
    """BLAKE3 of a tensor's element bytes: the data hash `blake3` (on every core for a large
    tensor: BLAKE3's result does not depend on how many threads compute it)."""
    if len(data) >= _THREADED_MIN:
        return blake3.blake3(data, max_threads=blake3.blake3.AUTO).digest()
    return blake3.blake3(data).digest()


def xxh3_1k_digest(data) -> bytes:
    """The data hash `xxh3-1k` of a tensor's element bytes (section 5.5): BLAKE3 of the leaves."""
    return blake3.blake3(xxh3_1k_leaves(data)).digest()


def xxh3_1k_leaves(data) -> bytes:
    """The leaves of the data hash `xxh3-1k` (section 5.5): XXH3-64 of each 1024-byte chunk of
    `data`, the last one zero-padded to 1024 bytes, as u64le, one after the other (none for no
    bytes). One call of xxhash a chunk: faster than XXH3 in numpy's 64-bit lanes over all the
    chunks at once (6.1 against 3.4 GB/s over 256 MB: python/bench/xxh3_leaf_cpu_rate.py)."""
    xxh3_64 = _xxh3_64()
    view = memoryview(data).cast("B")
    whole = len(view) - len(view) % XXH3_CHUNK
    leaves = [xxh3_64(view[at : at + XXH3_CHUNK]) for at in range(0, whole, XXH3_CHUNK)]
    if whole < len(view):
        leaves.append(xxh3_64(bytes(view[whole:]).ljust(XXH3_CHUNK, b"\0")))
    return np.array(leaves, dtype="<u8").tobytes()


def _xxh3_64():
    """xxhash's XXH3-64 of a buffer, as an int; imported when first needed, so that traces of
    `blake3` need no xxhash."""
    try:
        from xxhash import xxh3_64_intdigest
    except ImportError:
        raise ImportError(f"the data hash {XXH3_1K} needs the xxhash package: pip install xxhash") from None
    return xxh3_64_intdigest


_DATA_HASHERS = {BLAKE3: blake3_digest, XXH3_1K: xxh3_1k_digest}


# Bytes from which a tensor is hashed on several threads (below, starting them costs more).
_THREADED_MIN = 1 << 20


def tensor_hasher(dtype: str, shape: list[int]):
    """The BLAKE3 state of a canonical tensor hash after its dtype and shape: update a copy with
    the inner hash and take its hex digest (`tensor_hash_of_data_hash`, without the lookups)."""
    return _prefix(b"repro.tensor.v1", dtype, shape).copy()


def _hash_of(domain: bytes, dtype: str, shape: list[int], *fields: bytes) -> str:
    """BLAKE3 of a domain, a dtype and a shape as the canonical hashes encode them, then `fields`."""
    h = _prefix(domain, dtype, shape).copy()
    for f in fields:
        h.update(f)
    return h.digest().hex()  # as hexdigest(), in a third less time


def tensor_hash_prefix(dtype: str, shape: list[int]) -> bytes:
    """The bytes a canonical tensor hash hashes before the inner hash: its domain, dtype and
    shape (section 5)."""
    return _prefix_bytes(b"repro.tensor.v1", dtype, shape)


def _prefix_bytes(domain: bytes, dtype: str, shape: list[int]) -> bytes:
    return domain + bytes([len(dtype)]) + dtype.encode("ascii") + struct.pack(f"<{len(shape) + 1}Q", len(shape), *shape)


def _prefix(domain: bytes, dtype: str, shape: list[int]):
    """The BLAKE3 state after a domain, a dtype and a shape (not to be updated: copy it)."""
    key = (domain, dtype, tuple(shape))
    prefix = _PREFIXES.get(key)
    if prefix is None:
        prefix = blake3.blake3(_prefix_bytes(domain, dtype, shape))
        if len(_PREFIXES) >= _MAX_PREFIXES:
            _PREFIXES.clear()
        _PREFIXES[key] = prefix
    return prefix


# The hash states after a domain, dtype and shape, by those: a trace's steps hash the same
# shapes over and over (a writer hashes every record of every step).
_PREFIXES: dict = {}
_MAX_PREFIXES = 4096


def tensor_hash_of_data_hash(dtype: str, shape: list[int], inner: bytes) -> str:
    """The canonical hash from the data hash of the element bytes (computed elsewhere, on a GPU
    say)."""
    return _hash_of(b"repro.tensor.v1", dtype, shape, inner)


def view_hash(dtype: str, shape: list[int], of_hash: str, offset: int, strides: list[int]) -> str:
    """The hash of a view (format 1.5): derived from the hash of the tensor it reads and its layout."""
    return _hash_of(b"repro.view.v1", dtype, shape, bytes.fromhex(of_hash), struct.pack("<Q", offset),
                    *(struct.pack("<Q", s) for s in strides))


def view_within(shape: list[int], offset: int, strides: list[int], elements: int) -> bool:
    """Whether a view's last element lies among the `elements` elements it reads (an empty view reads none)."""
    if 0 in shape:
        return True
    return offset + sum((d - 1) * s for d, s in zip(shape, strides)) < elements


# ---------------------------------------------------------------------------------------------
# Records (section 3)


@dataclass
class View:
    of: str
    offset: int
    strides: list[int]


@dataclass
class Shard:
    whole: list[int]  # the whole tensor's shape
    offset: list[int]  # the block's first index along each dimension


@dataclass
class Tensor:
    name: str
    kind: str  # unknown kinds read as "other"
    dtype: str
    shape: list[int]
    hash: str
    inline: Optional[bytes]
    in_payload: bool
    phase: Optional[str]
    inputs: list[str]
    node: Optional[int]
    collective: Optional[str] = None  # format 1.3: the result of a sum across ranks
    source: Optional[str] = None  # format 1.4: a captured node's scope's FILE:LINE; 1.6: any record's
    view: Optional["View"] = None  # format 1.5: a captured node read through an earlier tensor's memory
    shard: Optional["Shard"] = None  # format 1.7: one rank's block of a tensor sharded across the ranks
    reduce_scatter: Optional[str] = None  # format 1.8: the shard is this rank's block of a sum across ranks

    @property
    def nbytes(self) -> int:
        n = DTYPE_SIZES[self.dtype]
        for d in self.shape:
            n *= d
        return n


@dataclass
class Step:
    step: int
    payload: Optional[str]
    tensors: list[Tensor]
    no_gradient: list[str] = field(default_factory=list)


def _pairs_to_map(pairs):
    out = {}
    for k, v in pairs:
        if not isinstance(k, str):
            raise _Bad(f"map key {k!r} is not a string")
        if k in out:
            raise _Bad(f"duplicate map key {_show(k)}")
        out[k] = v
    return out


def _show(s: str) -> str:
    return repr(s[:80])


def _check_depth(obj) -> None:
    """Counts nested maps/arrays (and ext values), the record's own map being level 1."""
    todo = [(obj, 1)]
    while todo:
        v, depth = todo.pop()
        if isinstance(v, (dict, list, msgpack.ExtType, msgpack.Timestamp)):
            if depth >= MAX_NESTING:
                raise _Bad(f"msgpack nested {MAX_NESTING} or more levels deep")
            if isinstance(v, dict):
                todo.extend((x, depth + 1) for x in v.values())
            elif isinstance(v, list):
                todo.extend((x, depth + 1) for x in v)


def _decode(payload: bytes) -> dict:
    try:
        obj = msgpack.unpackb(
            payload,
            raw=False,
            use_list=True,
            strict_map_key=False,
            unicode_errors="surrogateescape",  # invalid UTF-8 is only an error where a str is read
            object_pairs_hook=_pairs_to_map,
        )
    except _Bad:
        raise
    except msgpack.ExtraData:
        raise _Bad("bytes follow the msgpack value in the record")
    except Exception as e:  # msgpack raises several exception types for malformed input
        raise _Bad(f"not valid msgpack: {type(e).__name__}: {e}")
    _check_depth(obj)
    if not isinstance(obj, dict):
        raise _Bad(f"a record must be a msgpack map, not {type(obj).__name__}")
    return obj


_MISSING = object()


def _get(m: dict, key: str, what: str, default=_MISSING):
    if key in m:
        return m[key]
    if default is _MISSING:
        raise _Bad(f"{what} lacks the required key `{key}`")
    return default


def _uint(v, what: str, limit: int = U64_MAX) -> int:
    if type(v) is not int or v < 0 or v > limit:
        raise _Bad(f"{what} must be an unsigned integer{' (u16)' if limit == U16_MAX else ''}, got {v!r:.80}")
    return v


def _str(v, what: str) -> str:
    if not isinstance(v, str):
        raise _Bad(f"{what} must be a string, got {type(v).__name__}")
    try:
        v.encode("utf-8")
    except UnicodeEncodeError:
        raise _Bad(f"{what} is not valid UTF-8")
    return v


def _map(v, what: str) -> dict:
    if not isinstance(v, dict):
        raise _Bad(f"{what} must be a map, got {type(v).__name__}")
    return v


def _list(v, what: str) -> list:
    if not isinstance(v, list):
        raise _Bad(f"{what} must be an array, got {type(v).__name__}")
    return v


def _opt(m: dict, key: str, what: str, parse):
    """An Option field: absent key or nil mean absent."""
    v = m.get(key)
    return None if v is None else parse(v, f"{what} `{key}`")


def _str_map(v, what: str) -> dict:
    return {_str(k, f"a key of {what}"): _str(x, f"{what}[{_show(k)}]") for k, x in _map(v, what).items()}


def _rust_u64(s: str) -> Optional[int]:
    """Rust's `u64::from_str`: an optional `+`, then one or more ASCII digits."""
    digits = s[1:] if s.startswith("+") else s
    if not digits or not all("0" <= c <= "9" for c in digits):
        return None
    n = int(digits)
    return n if n <= U64_MAX else None


def parse_capture(text: str):
    """A step policy (section 3.2): the capture policy's `full`, and its `modules` and `ops`
    levels (format 1.9), with the aliases and leniency repro accepts."""
    if text in ("none", "hashes"):
        return ("none",)
    if text in ("all", "first"):
        return (text,)
    if text in ("first-and-last", "default"):
        return ("first-and-last",)
    if text.startswith("every:"):
        n = _rust_u64(text[len("every:") :])
        if n:
            return ("every", n)
    elif text.startswith("steps:"):
        body = text[len("steps:") :]
        if body == "":
            return ("steps", [])
        nums = [_rust_u64(x.strip(RUST_WHITESPACE)) for x in body.split(",")]
        if all(n is not None for n in nums):
            return ("steps", sorted(set(nums)))
    raise _Bad(f"invalid capture policy {_show(text)}")


def _step_policy(v, what: str):
    """A header's step policy other than `full` (`parse_capture`), its key named where corrupt."""
    text = _str(v, what)
    try:
        return parse_capture(text)
    except _Bad:
        raise _Bad(f"{what} {_show(text)} is not a step policy ({STEP_POLICY_FORMS})") from None


def _parse_header(m: dict) -> dict:
    fmt = _map(_get(m, "format", "the header"), "header `format`")
    major = _uint(_get(fmt, "major", "header `format`"), "format `major`", U16_MAX)
    minor = _uint(_get(fmt, "minor", "header `format`"), "format `minor`", U16_MAX)
    run = _map(_get(m, "run", "the header"), "header `run`")
    env = _map(_get(m, "environment", "the header"), "header `environment`")
    cap = _map(_get(m, "capture", "the header"), "header `capture`")
    environment = {k: _str(_get(env, k, "`environment`"), f"environment `{k}`")
                   for k in ("repro_version", "candle_version", "device", "device_name", "cpu_model", "os", "rustc")}
    environment["threads"] = _uint(_get(env, "threads", "`environment`"), "environment `threads`")
    environment["env"] = _str_map(_get(env, "env", "`environment`"), "environment `env`")
    distributed = None
    if m.get("distributed") is not None:  # format 1.3: one rank's stream of a data-parallel run
        d = _map(m["distributed"], "header `distributed`")
        distributed = {
            "rank": _uint(_get(d, "rank", "`distributed`"), "distributed `rank`"),
            "world_size": _uint(_get(d, "world_size", "`distributed`"), "distributed `world_size`"),
            "backend": _str(_get(d, "backend", "`distributed`"), "distributed `backend`"),
            "backend_version": _str(_get(d, "backend_version", "`distributed`"), "distributed `backend_version`"),
        }
        if distributed["rank"] >= distributed["world_size"]:
            raise _Bad(f"header `distributed`: rank {distributed['rank']} is not below the world size {distributed['world_size']}")
    data_hash = _opt(m, "data_hash", "header", _str)  # format 2.0: how tensors' data hashes are computed
    if data_hash is not None and data_hash not in DATA_HASHES:
        raise _Bad(f"header `data_hash` {_show(data_hash)} is not one of {', '.join(DATA_HASHES)}")
    return {
        "data_hash": data_hash,
        "distributed": distributed,
        "format": (major, minor),
        "producer": _str(_get(m, "producer", "the header"), "header `producer`"),
        "run": {
            "workload": _str(_get(run, "workload", "`run`"), "run `workload`"),
            "steps": _opt(run, "steps", "run", _uint),
            "params": _str_map(_get(run, "params", "`run`"), "run `params`"),
        },
        "environment": environment,
        "capture": {
            "full": parse_capture(_str(_get(cap, "full", "`capture`"), "capture `full`")),
            "inline_max_bytes": _uint(_get(cap, "inline_max_bytes", "`capture`"), "capture `inline_max_bytes`"),
            # Format 1.9: the steps recording every module's output and every op's (the capture
            # ladder's levels, docs/pytorch.md); None where the producer does not say.
            **{level: _opt(cap, level, "capture", _step_policy) for level in CAPTURE_LEVELS},
        },
    }


def _parse_hash(v, what: str) -> str:
    s = _str(v, what)
    if len(s) != 64 or any(c not in "0123456789abcdef" for c in s):
        raise _Bad(f"{what} {_show(s)} is not 64 lowercase hex digits")
    return s


def _parse_tensor(m, i: int) -> Tensor:
    m = _map(m, f"tensor record {i}")
    what = f"tensor record {i}"
    name = _str(_get(m, "name", what), f"{what} `name`")
    what = f"tensor `{name}`"
    kind = _str(_get(m, "kind", what), f"{what} `kind`")
    dtype = _str(_get(m, "dtype", what), f"{what} `dtype`")
    if dtype not in DTYPE_SIZES:
        raise _Bad(f"{what} has unknown dtype {_show(dtype)}")
    shape = [_uint(d, f"{what} shape entry") for d in _list(_get(m, "shape", what), f"{what} `shape`")]
    inline = m.get("inline")
    if inline is not None and not isinstance(inline, bytes):
        raise _Bad(f"{what} `inline` must be msgpack bin, got {type(inline).__name__}")
    in_payload = m.get("in_payload", False)
    if type(in_payload) is not bool:
        raise _Bad(f"{what} `in_payload` must be a bool")
    phase = _opt(m, "phase", what, _str)
    if phase is not None and phase not in PHASES:
        raise _Bad(f"{what} has unknown phase {_show(phase)}")
    return Tensor(
        name=name,
        kind=kind if kind in KINDS else "other",
        dtype=dtype,
        shape=shape,
        hash=_parse_hash(_get(m, "hash", what), f"{what} `hash`"),
        inline=inline,
        in_payload=in_payload,
        phase=phase,
        inputs=[_str(x, f"{what} input name") for x in _list(m.get("inputs", []), f"{what} `inputs`")],
        node=_opt(m, "node", what, _uint),
        collective=_opt(m, "collective", what, _str),
        source=_opt(m, "source", what, _str),
        view=_opt(m, "view", what, _parse_view),
        shard=_opt(m, "shard", what, _parse_shard),
        reduce_scatter=_opt(m, "reduce_scatter", what, _str),
    )


def _parse_view(v, what: str) -> View:
    m = _map(v, what)
    return View(
        of=_str(_get(m, "of", what), f"{what} `of`"),
        offset=_uint(_get(m, "offset", what), f"{what} `offset`"),
        strides=[_uint(x, f"{what} stride") for x in _list(_get(m, "strides", what), f"{what} `strides`")],
    )


def _parse_shard(v, what: str) -> Shard:
    m = _map(v, what)
    return Shard(
        whole=[_uint(x, f"{what} whole dimension") for x in _list(_get(m, "whole", what), f"{what} `whole`")],
        offset=[_uint(x, f"{what} offset") for x in _list(_get(m, "offset", what), f"{what} `offset`")],
    )


def _parse_step(m: dict) -> Step:
    step = _uint(_get(m, "step", "the step record"), "step `step`")
    return Step(
        step=step,
        payload=_opt(m, "payload", f"step {step}", _str),
        tensors=[_parse_tensor(t, i) for i, t in enumerate(_list(_get(m, "tensors", f"step {step}"), "step `tensors`"))],
        no_gradient=[_str(x, "a `no_gradient` name") for x in _list(m.get("no_gradient", []), "step `no_gradient`")],
    )


def _parse_footer(m: dict) -> dict:
    return {
        "steps": _uint(_get(m, "steps", "the footer"), "footer `steps`"),
        "stopped": _opt(m, "stopped", "footer", _str),
    }


def parse_record(payload: bytes):
    """Decodes one frame payload into ("header" | "step" | "footer", value)."""
    m = _decode(payload)
    kind = _str(_get(m, "type", "the record"), "record `type`")
    if kind == "header":
        return kind, _parse_header(m)
    if kind == "step":
        return kind, _parse_step(m)
    if kind == "footer":
        return kind, _parse_footer(m)
    raise _Bad(f"unknown record type {_show(kind)}")


def payload_name(step: int) -> str:
    return f"{TENSORS_DIR}/step-{step:08d}.safetensors"


# ---------------------------------------------------------------------------------------------
# The trace reader (sections 1, 2, 4, 7)


class Trace:
    """Reads a trace directory (or a lone record file) one record at a time.

    `data_hash` says how its tensors' data hashes are computed (`blake3` or `xxh3-1k`): values
    are checked against their hashes so, and hashes compare only with those of a trace of the
    same data hash. After `steps()` is exhausted, `complete` says whether the footer was read
    without `stopped`, and `incomplete_reason` why not.
    """

    def __init__(self, path: str):
        self.path = str(path)
        st = os.stat(self.path)
        parent = os.path.dirname(os.path.abspath(self.path))
        if (not stat.S_ISDIR(st.st_mode) and os.path.basename(self.path) == RECORDS_FILE
                and os.path.isdir(os.path.join(parent, TENSORS_DIR))
                and not os.path.islink(os.path.join(parent, TENSORS_DIR))):
            # A trace's own record file (section 8) opens the whole trace.
            self.path, st = parent, os.stat(parent)
        if stat.S_ISDIR(st.st_mode):
            self.dir = self.path
            self.records_path = os.path.join(self.path, RECORDS_FILE)
            self.records_only = False
            if not os.path.exists(self.records_path):
                raise NotATrace(self.path, f"the directory has no {RECORDS_FILE}")
        else:  # a lone record file (section 8): a trace without payloads
            self.dir = os.path.dirname(self.path)
            self.records_path = self.path
            self.records_only = True
        self._f = open(self.records_path, "rb")
        pre = self._f.read(PREAMBLE_LEN)
        if len(pre) < len(MAGIC) or pre[: len(MAGIC)] != MAGIC:
            raise NotATrace(self.records_path, "the file does not start with the magic bytes RPRTRACE")
        if len(pre) < PREAMBLE_LEN:
            raise Corrupt(self.records_path, "the file ends inside its preamble", "byte 8")
        major, minor = struct.unpack("<HH", pre[8:12])
        self.version = (major, minor)
        if major not in SUPPORTED_MAJORS:
            raise Unsupported(
                self.records_path,
                f"trace format {major}.{minor}, but this reader (format {READER_VERSION}) reads only "
                f"{' and '.join(f'{m}.x' for m in SUPPORTED_MAJORS)}; upgrade the reader to read it",
            )
        self._offset = PREAMBLE_LEN
        self._last_step: Optional[int] = None
        self.steps_read = 0
        self.complete = False
        self.incomplete_reason: Optional[str] = None
        self._done = False
        self._payload_cache: Optional[tuple[int, dict]] = None
        rec = self._next_record()
        if rec is None:
            raise Corrupt(self.records_path, "no complete header record: the recorder died before writing it",
                          "the first record")
        kind, header = rec
        if kind != "header":
            raise Corrupt(self.records_path, f"expected the header record, found a {kind} record", "the first record")
        if header["format"] != self.version:
            raise Corrupt(self.records_path, "header says format %d.%d but the preamble says %d.%d"
                          % (header["format"] + self.version), "the header record")
        if header["distributed"] is not None:
            self._needs((1, 3), "`distributed`", "the header record")
        if header["data_hash"] not in (None, BLAKE3):
            self._needs((2, 0), "`data_hash` other than blake3", "the header record")
        for level in CAPTURE_LEVELS:
            if header["capture"][level] is not None:
                self._needs((1, 9), f"capture `{level}`", "the header record")
        for key in ("full", *CAPTURE_LEVELS):
            if header["capture"][key] == ("first",) and self.version < (1, 9):
                raise self._corrupt(f"capture `{key}`: the policy `first` is of format 1.9, but the file declares "
                                    f"{self.version[0]}.{self.version[1]}", "the header record")
        self.header = header
        # How every tensor's data hash is computed (section 5): `blake3` or `xxh3-1k` (2.0).
        self.data_hash: str = header["data_hash"] or BLAKE3

    def _needs(self, version: tuple, key: str, where: str) -> None:
        """A key newer than the declared version is corrupt (sections 7 and 8)."""
        if self.version < version:
            raise self._corrupt(f"{key} is a key of format {version[0]}.{version[1]}, but the file declares "
                                f"{self.version[0]}.{self.version[1]}", where)

    def close(self) -> None:
        self._f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _here(self) -> str:
        return "before the first step" if self._last_step is None else f"after step {self._last_step}"

    def _corrupt(self, problem: str, where: str) -> Corrupt:
        return Corrupt(self.records_path, problem, where)

    def _next_record(self):
        """The next record, or None at the end of the file (clean or truncated: incomplete)."""
        start = self._offset
        head = self._f.read(FRAME_HEADER_LEN)
        if len(head) == 0:
            self._end(f"the trace ends after {self.steps_read} step(s) without a footer")
            return None
        if len(head) < FRAME_HEADER_LEN:
            self._end(f"the last record (at byte {start}) is cut short after {self.steps_read} complete step(s)")
            return None
        length, crc = struct.unpack("<II", head)
        if length > MAX_RECORD_BYTES:  # checked before reading or allocating the payload
            raise self._corrupt(f"record length {length} exceeds the limit of {MAX_RECORD_BYTES} bytes",
                                f"byte {start}, {self._here()}")
        payload = self._f.read(length)
        if len(payload) < length:
            self._end(f"the last record (at byte {start}) is cut short after {self.steps_read} complete step(s)")
            return None
        actual = zlib.crc32(payload, zlib.crc32(head[:4]))
        if actual != crc:
            raise self._corrupt(f"checksum mismatch (stored {crc:08x}, computed {actual:08x})",
                                f"byte {start}, {self._here()}")
        self._offset += FRAME_HEADER_LEN + length
        try:
            return parse_record(payload)
        except _Bad as e:
            raise self._corrupt(f"undecodable record: {e}", f"byte {start}, {self._here()}")

    def _end(self, reason: str) -> None:
        self._done = True
        self.complete = False
        self.incomplete_reason = reason

    def steps(self) -> Iterator[Step]:
        """Yields the step records in order, checking each (section 3.5) before handing it out."""
        while not self._done:
            start = self._offset
            rec = self._next_record()
            if rec is None:
                return
            kind, value = rec
            if kind == "header":
                raise self._corrupt("a second header record", f"byte {start}, {self._here()}")
            if kind == "footer":
                self._footer(value, start)
                return
            self._check_step(value, start)
            self._last_step = value.step
            self.steps_read += 1
            yield value

    def _footer(self, footer: dict, start: int) -> None:
        if footer["stopped"] is not None:
            self._needs((1, 2), "`stopped`", f"byte {start}, the footer")
        if footer["steps"] != self.steps_read:
            raise self._corrupt(f"the footer counts {footer['steps']} steps, the trace holds {self.steps_read}",
                                f"byte {start}, the footer")
        if self._f.read(1):
            raise self._corrupt("data after the footer", f"byte {self._offset}")
        self._done = True
        if footer["stopped"] is None:
            self.complete = True
        else:
            self.incomplete_reason = f"stopped early: {footer['stopped']}"

    def _check_step(self, s: Step, start: int) -> None:
        where = f"byte {start}, step {s.step}"
        if self._last_step is not None and s.step <= self._last_step:
            raise self._corrupt(f"steps out of order (step {s.step} follows step {self._last_step})", where)
        if s.payload is not None and s.payload != payload_name(s.step):
            raise self._corrupt(f"payload reference {_show(s.payload)} is not this step's payload file", where)
        if s.no_gradient:
            self._needs((1, 2), "`no_gradient`", where)
        names = {}
        for t in s.tensors:
            if t.name in names:
                raise self._corrupt(f"tensor `{t.name}` appears twice", where)
            if t.phase is not None or t.inputs:
                self._needs((1, 1), "`phase` or `inputs`", where)
            since = KINDS_SINCE.get(t.kind, {}).get(self.version[0])
            if since is not None and self.version < since:
                first = KINDS_SINCE[t.kind]
                newer = f"{first[1][0]}.{first[1][1]}" if t.kind == "buffer" else (
                    f"{first[1][0]}.{first[1][1]} ({first[2][0]}.{first[2][1]} under xxh3-1k)")
                raise self._corrupt(f"tensor `{t.name}`: the kind `{t.kind}` is of format {newer}, but the file declares "
                                    f"{self.version[0]}.{self.version[1]}", where)
            if t.node is not None:
                self._needs((1, 2), "`node`", where)
            if t.source is not None:
                self._needs((1, 4), "`source`", where)
                if t.node is None and self.version < (1, 6):
                    raise self._corrupt(f"tensor `{t.name}`: `source` is a captured node's before format 1.6: the record "
                                        "has no `node`", where)
                if len(t.source.encode()) > MAX_SOURCE_BYTES:
                    raise self._corrupt(f"tensor `{t.name}`: `source` is {len(t.source.encode())} bytes (at most "
                                        f"{MAX_SOURCE_BYTES})", where)
            if t.reduce_scatter is not None:
                self._needs((1, 8), "`reduce_scatter`", where)
                if t.reduce_scatter != "sum":
                    raise self._corrupt(f"tensor `{t.name}`: unknown reduce-scatter {_show(t.reduce_scatter)}", where)
                if t.collective is not None:
                    raise self._corrupt(f"tensor `{t.name}`: a record is the result of one collective: it carries "
                                        "`collective` and `reduce_scatter`", where)
                if t.shard is None:
                    raise self._corrupt(f"tensor `{t.name}`: a reduce-scatter's result is this rank's block of the "
                                        "sum: the record has no `shard`", where)
                self._check_contribution(t, names, t.shard.whole, where)
            if t.collective is not None:
                self._needs((1, 3), "`collective`", where)
                if t.collective != "all_reduce_sum":
                    raise self._corrupt(f"tensor `{t.name}`: unknown collective {_show(t.collective)}", where)
                self._check_contribution(t, names, t.shape, where)
            if t.view is not None:
                self._needs((1, 5), "`view`", where)
                self._check_view(t, names.get(t.view.of), where)
            if t.shard is not None:
                self._needs((1, 7), "`shard`", where)
                sh = t.shard
                if len(sh.whole) != len(t.shape) or len(sh.offset) != len(t.shape):
                    raise self._corrupt(f"tensor `{t.name}`: its shard has a whole of {len(sh.whole)} and an offset of "
                                        f"{len(sh.offset)} dimensions for a block of {len(t.shape)}", where)
                whole_bytes = DTYPE_SIZES.get(t.dtype, 1)
                for w in sh.whole:
                    whole_bytes *= w
                if whole_bytes > U64_MAX:
                    raise self._corrupt(f"tensor `{t.name}`: its shard's whole {sh.whole} holds more than 2^64 - 1 "
                                        "bytes", where)
                if any(o + d > w for o, d, w in zip(sh.offset, t.shape, sh.whole)):
                    raise self._corrupt(f"tensor `{t.name}`: its shard reaches past the whole", where)
                if t.view is not None:
                    raise self._corrupt(f"tensor `{t.name}`: a view cannot be a shard", where)
                one_device = self.header["distributed"] is None or self.header["distributed"]["world_size"] == 1
                if one_device and (sh.whole != t.shape or any(sh.offset)):
                    raise self._corrupt(f"tensor `{t.name}`: its shard is a block {t.shape} at {sh.offset} of a whole "
                                        f"{sh.whole}, but a trace of one device has no other rank to hold the rest",
                                        where)
            names[t.name] = t
            if len(t.shape) > MAX_RANK:
                raise self._corrupt(f"tensor `{t.name}` has rank {len(t.shape)} (limit {MAX_RANK})", where)
            n = DTYPE_SIZES[t.dtype]
            for d in t.shape:  # overflow-checked u64 product, starting from the element size
                n *= d
                if n > U64_MAX:
                    raise self._corrupt(f"tensor `{t.name}` has an impossible shape {t.shape}", where)
            if t.inline is not None and len(t.inline) != n:
                raise self._corrupt(f"tensor `{t.name}` stores {len(t.inline)} inline bytes for {n} expected", where)
            if t.in_payload and s.payload is None:
                raise self._corrupt(f"tensor `{t.name}` refers to a payload the step does not have", where)

    def _check_contribution(self, t: Tensor, names: dict, whole: list, where: str) -> None:
        """A sum across the ranks names exactly one input, this rank's contribution, recorded
        earlier in the step with its dtype and the whole sum's shape `whole`."""
        if len(t.inputs) != 1:
            raise self._corrupt(f"tensor `{t.name}`: a collective sums exactly one contribution per rank; "
                                f"it names {len(t.inputs)}", where)
        share = names.get(t.inputs[0])
        if share is None:
            raise self._corrupt(f"tensor `{t.name}`: its contribution `{t.inputs[0]}` is not recorded "
                                "earlier in the step", where)
        if (share.dtype, share.shape) != (t.dtype, list(whole)):
            raise self._corrupt(f"tensor `{t.name}`: its contribution `{t.inputs[0]}` is {share.dtype} "
                                f"{share.shape}, the sum {t.dtype} {list(whole)}", where)

    def _check_view(self, t: Tensor, owner: Optional[Tensor], where: str) -> None:
        v = t.view
        bad = lambda why: self._corrupt(f"tensor `{t.name}`: {why}", where)
        if t.node is None:
            raise bad("`view` is a captured node's: the record has no `node`")
        if len(v.strides) != len(t.shape):
            raise bad(f"its view has {len(v.strides)} strides for {len(t.shape)} dimensions")
        if owner is None:
            raise bad(f"it is a view of `{v.of}`, which is not recorded earlier in the step")
        if owner.view is not None:
            raise bad(f"it is a view of `{v.of}`, itself a view")
        if owner.dtype != t.dtype:
            raise bad(f"it is a {t.dtype} view of `{v.of}`, which is {owner.dtype}")
        elements = 1
        for d in owner.shape:
            elements *= d
        if not view_within(t.shape, v.offset, v.strides, elements):
            raise bad(f"its view reads past the {elements} elements of `{v.of}`")
        if t.inline is not None or t.in_payload:
            raise bad("a view stores no values of its own (they are its owner's)")
        if view_hash(t.dtype, t.shape, owner.hash, v.offset, v.strides) != t.hash:
            raise bad(f"its hash is not the hash of its view of `{v.of}`")

    # -- values --------------------------------------------------------------------------------

    def _payload_entries(self, s: Step) -> dict:
        if self._payload_cache is not None and self._payload_cache[0] == s.step:
            return self._payload_cache[1]
        where = f"step {s.step}"
        self._payload_cache = None
        path = os.path.join(self.dir, s.payload)
        for p in (os.path.join(self.dir, TENSORS_DIR), path):
            st = os.lstat(p)
            if stat.S_ISLNK(st.st_mode):
                raise Corrupt(p, "payloads must not be symbolic links", where)
        if not stat.S_ISREG(os.lstat(path).st_mode):
            raise Corrupt(path, "the payload is not a regular file", where)
        with open(path, "rb") as f:
            data = f.read()
        try:
            entries = {name: info for name, info in safetensors.deserialize(data)}
        except Exception as e:
            raise Corrupt(path, f"not a valid safetensors file: {e}", where)
        self._payload_cache = (s.step, entries)
        return entries

    def values(self, s: Step, t: Tensor) -> Optional[bytes]:
        """The tensor's element bytes, checked against its hash, or None if only the hash is stored."""
        where = f"step {s.step}, tensor `{t.name}`"
        if t.view is not None:
            # The owner's values (checked against its hash), read through the view's layout.
            owner = next(o for o in s.tensors if o.name == t.view.of and o.view is None)
            data = self.values(s, owner)
            if data is None:
                return None
            size = DTYPE_SIZES[t.dtype]
            elements = np.frombuffer(data, dtype=np.uint8).reshape(-1, size)
            index = np.full(t.shape, t.view.offset, dtype=np.int64)
            for axis, stride in enumerate(t.view.strides):
                shape = [1] * len(t.shape)
                shape[axis] = t.shape[axis]
                index = index + np.arange(t.shape[axis], dtype=np.int64).reshape(shape) * stride
            return elements[index.reshape(-1)].tobytes()
        if t.inline is not None:
            data, path = t.inline, self.records_path
        elif t.in_payload and self.records_only:
            return None  # a lone record file keeps the hash; the values stayed in the trace
        elif t.in_payload:
            entries = self._payload_entries(s)
            path = os.path.join(self.dir, s.payload)
            e = entries.get(t.name)
            if e is None:
                raise Corrupt(path, "the payload file does not hold this tensor", where)
            if e["dtype"] != t.dtype or list(e["shape"]) != t.shape:
                raise Corrupt(path, f"payload holds {e['dtype']} {list(e['shape'])}, the record says {t.dtype} {t.shape}",
                              where)
            data = bytes(e["data"])
        else:
            return None
        if tensor_hash(t.dtype, t.shape, data, self.data_hash) != t.hash:
            raise HashMismatch(path, "the stored values do not match the recorded hash", where)
        return data

    def array(self, s: Step, t: Tensor) -> Optional[np.ndarray]:
        """The tensor's values as `values` reads them (checked against its hash, a view's through
        its owner's) as a numpy array of its shape (`as_array`), or None if only the hash is stored."""
        data = self.values(s, t)
        return None if data is None else as_array(t.dtype, t.shape, data)


# ---------------------------------------------------------------------------------------------
# Tensors as numpy arrays

_NUMPY_DTYPES = {"U8": "<u1", "U32": "<u4", "I16": "<i2", "I32": "<i4", "I64": "<i8", "F16": "<f2", "F32": "<f4",
                 "F64": "<f8"}


def _flat_array(dtype: str, data: bytes) -> np.ndarray:
    """Canonical element bytes (section 5.1) as a flat array; BF16, which numpy has no type for,
    widened to float32 exactly (a bfloat16 is the upper half of the float32 of the same value)."""
    if dtype == "BF16":
        return (np.frombuffer(data, "<u2").astype(np.uint32) << 16).view(np.float32)
    return np.frombuffer(data, _NUMPY_DTYPES[dtype])


def as_array(dtype: str, shape: list[int], data: bytes) -> np.ndarray:
    """Canonical element bytes as a numpy array of `shape` (`[]`: a 0-d array), of the dtype's
    numpy type, BF16 as float32; read-only (it shares `data`) except for BF16."""
    return _flat_array(dtype, data).reshape(shape)


def read_tensor(path: str, step: int, name: str) -> np.ndarray:
    """Tensor `name` at step `step` of the trace at `path` (a directory or a record file) as a
    numpy array (`Trace.array`). LookupError when the trace has no such step or tensor, or keeps
    only its hash at that step."""
    with Trace(path) as tr:
        s = next((s for s in tr.steps() if s.step >= step), None)
        if s is None or s.step != step:
            raise LookupError(f"{path}: the trace has no step {step}")
        t = next((x for x in s.tensors if x.name == name), None)
        if t is None:
            raise LookupError(f"{path}: step {step} has no tensor `{name}`")
        values = tr.array(s, t)
    if values is None:
        raise LookupError(f"{path}: step {step}, tensor `{name}`: the trace keeps only its hash at this step "
                          f"(record with --capture steps:{step} to keep its values)")
    return values


# ---------------------------------------------------------------------------------------------
# Commands


def _status(tr: Trace) -> str:
    return "complete" if tr.complete else f"incomplete: {tr.incomplete_reason}"


def cmd_verify(path: str) -> int:
    steps = tensors = checked = 0
    mismatches = []
    with Trace(path) as tr:
        for s in tr.steps():
            steps += 1
            for t in s.tensors:
                tensors += 1
                if t.view is not None:
                    continue  # no values of its own; its hash was checked against its owner's
                try:
                    if tr.values(s, t) is not None:
                        checked += 1
                except HashMismatch as e:
                    checked += 1
                    mismatches.append(e)
                    print(f"MISMATCH {e}", file=sys.stderr)
        fmt = "%d.%d" % tr.version + ("" if tr.data_hash == BLAKE3 else f" (data hash {tr.data_hash})")
        status = _status(tr)
    if mismatches:
        print(f"FAILED {path}: format {fmt}, {steps} steps, {tensors} tensors, "
              f"{len(mismatches)} of {checked} stored values do not match their hashes ({status})")
        return 1
    print(f"OK {path}: format {fmt}, {steps} steps, {tensors} tensors, "
          f"{checked} stored values match their hashes ({status})")
    return 0


def _max_ulp(dtype: str, a: bytes, b: bytes) -> int:
    """Largest distance in units in the last place, +0 and -0 counting as equal."""
    width = DTYPE_SIZES[dtype] * 8
    ua = np.frombuffer(a, f"<u{width // 8}").astype(np.uint64)
    ub = np.frombuffer(b, f"<u{width // 8}").astype(np.uint64)
    sign = np.uint64(1 << (width - 1))
    ma, mb = ua & ~sign, ub & ~sign
    same_sign = (ua & sign) == (ub & sign)
    dist = np.where(same_sign, np.where(ma > mb, ma - mb, mb - ma), ma + mb)
    return int(dist.max()) if dist.size else 0


def describe_values(dtype: str, shape: list[int], a: bytes, b: bytes) -> str:
    size = DTYPE_SIZES[dtype]
    n = len(a) // size
    if n == 0:
        return "empty tensors"
    differ = int((np.frombuffer(a, np.uint8).reshape(n, size) != np.frombuffer(b, np.uint8).reshape(n, size)).any(axis=1).sum())
    if dtype in ("F16", "BF16", "F32", "F64"):
        with np.errstate(invalid="ignore", over="ignore"):
            diff = np.abs(_flat_array(dtype, a).astype(np.float64) - _flat_array(dtype, b).astype(np.float64))
        nan = np.isnan(diff)
        mad = float(diff[~nan].max()) if (~nan).any() else float("nan")
        note = " (NaN involved)" if nan.any() else ""
        return f"{differ} of {n} elements differ, max abs diff {mad:.6g}, max ULP distance {_max_ulp(dtype, a, b)}{note}"
    ia = _flat_array(dtype, a).astype(object)
    ib = _flat_array(dtype, b).astype(object)
    return f"{differ} of {n} elements differ, max abs diff {max(abs(x - y) for x, y in zip(ia, ib))}"


def cmd_diff(path_a: str, path_b: str) -> int:
    with Trace(path_a) as ta, Trace(path_b) as tb:
        if ta.data_hash != tb.data_hash:  # their hashes never agree (section 5.5)
            print(f"error: {path_a} hashes tensors with the data hash {ta.data_hash}, {path_b} with {tb.data_hash}: "
                  "their hashes cannot be compared; record both with the same data hash", file=sys.stderr)
            return 2
        ia, ib = ta.steps(), tb.steps()
        sa, sb = next(ia, None), next(ib, None)
        compared = 0
        while sa is not None or sb is not None:
            if sb is None or (sa is not None and sa.step < sb.step):
                print(f"DIVERGED at step {sa.step}: the step is only in A ({path_a})")
                return 1
            if sa is None or sb.step < sa.step:
                print(f"DIVERGED at step {sb.step}: the step is only in B ({path_b})")
                return 1
            by_name = {t.name: t for t in sb.tensors}
            for t in sa.tensors:
                u = by_name.get(t.name)
                if u is None:
                    print(f"DIVERGED at step {sa.step}, tensor `{t.name}`: only in A")
                    return 1
                if t.hash != u.hash:
                    print(f"DIVERGED at step {sa.step}, tensor `{t.name}` ({t.kind}): hashes differ")
                    print(f"  A: {t.dtype} {t.shape} {t.hash}")
                    print(f"  B: {u.dtype} {u.shape} {u.hash}")
                    va, vb = ta.values(sa, t), tb.values(sb, u)
                    if va is None or vb is None:
                        side = " and ".join(x for x, v in (("A", va), ("B", vb)) if v is None)
                        print(f"  values: not stored in {side}")
                    elif t.dtype != u.dtype or t.shape != u.shape:
                        print("  values: dtype or shape differ, not compared")
                    else:
                        print(f"  values: {describe_values(t.dtype, t.shape, va, vb)}")
                    return 1
            names_a = {t.name for t in sa.tensors}
            for u in sb.tensors:
                if u.name not in names_a:
                    print(f"DIVERGED at step {sb.step}, tensor `{u.name}`: only in B")
                    return 1
            compared += 1
            sa, sb = next(ia, None), next(ib, None)
        note = "" if ta.complete and tb.complete else f" (A {_status(ta)}; B {_status(tb)})"
        print(f"IDENTICAL: {compared} steps, every tensor hash equal{note}")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m repro.trace", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    v = sub.add_parser("verify", help="check every stored value against its recorded hash")
    v.add_argument("trace")
    d = sub.add_parser("diff", help="find the first step and tensor whose hashes differ")
    d.add_argument("trace_a")
    d.add_argument("trace_b")
    args = p.parse_args(argv)
    try:
        if args.cmd == "verify":
            return cmd_verify(args.trace)
        return cmd_diff(args.trace_a, args.trace_b)
    except HashMismatch as e:
        print(f"error: {e}", file=sys.stderr)
        return 1 if args.cmd == "verify" else 2
    except TraceError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"error: {e.filename or ''}: {e.strerror or e}", file=sys.stderr)
        return 2
    except ImportError as e:  # xxhash, for the values of a trace of the data hash `xxh3-1k`
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
