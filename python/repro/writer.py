"""A writer of the repro trace format (docs/trace-format.md, formats 1.9 and 2.0), in Python.

It writes what `repro record` writes, so `repro diff`, `inspect`, `matrix` and `gate` read a run
recorded from Python like one recorded by repro: framed msgpack records (section 2), step
records with tensors inline, in a safetensors payload or as hashes only (sections 3, 4, 6), and
the canonical hash of section 5 (`repro.trace.tensor_hash`, shared with the reader), its data
hash `blake3` (a trace of format 1.9) or `xxh3-1k` (format 2.0, section 5.5). It takes tensors as
(dtype, shape, element bytes); `repro.torch` feeds it PyTorch tensors.

It is pure Python over msgpack, blake3, numpy and safetensors, and xxhash for traces of the data
hash `xxh3-1k` (the packages the reader uses): installing it needs no Rust toolchain, and that
the Rust and Python sides agree is tested by `repro inspect --verify`, which recomputes every
hash a Python-written trace holds (python/tests/test_writer.py and test_data_hash.py, run in CI
by scripts/python-reader-check.sh and scripts/python-torch-check.sh).

    w = TraceWriter("runs/torch", run={"workload": "mine", "steps": 10, "params": {"lr": "0.1"}})
    w.write_step(0, [Record("x", "input", "F32", [2], struct.pack("<2f", 1, 2))])
    w.finish()
"""

from __future__ import annotations

import ctypes
import fcntl
import itertools
import json
import math
import os
import platform
import re
import struct
import zlib
from binascii import hexlify
from dataclasses import dataclass, field
from typing import Iterable, NamedTuple, Optional, Sequence

import msgpack
import numpy as np
import safetensors

from repro.trace import (
    BLAKE3,
    DATA_HASHES,
    DTYPE_SIZES,
    KINDS,
    MAGIC,
    MAX_RANK,
    MAX_RECORD_BYTES,
    MAX_SOURCE_BYTES,
    PHASES,
    PROGRESS_FILE,
    RECORDS_FILE,
    STEP_POLICY_FORMS,
    TENSORS_DIR,
    U64_MAX,
    XXH3_1K,
    data_hasher,
    parse_capture,
    payload_name,
    tensor_hash_prefix,
    tensor_hasher,
    view_hash,
    view_within,
)

# The version a trace is written as, by its data hash (section 8): 1.10, which every 1.x reader
# reads, for `blake3`; 2.1 for `xxh3-1k`, whose hashes a 1.x reader would check as BLAKE3's.
FORMATS = {BLAKE3: (1, 10), XXH3_1K: (2, 1)}
VERSION = "0.1.0"
LOCK_FILE = ".repro-lock"
# Where a recorder can be, in `progress.json` (section 10.1).
PROGRESS_POINTS = ("computing", "collective", "done")
# The safetensors package's names for the trace's dtypes (section 4.2 stores the trace's own).
_SAFETENSORS_DTYPES = {
    "U8": "uint8", "U32": "uint32", "I16": "int16", "I32": "int32", "I64": "int64",
    "F16": "float16", "BF16": "bfloat16", "F32": "float32", "F64": "float64",
}
# Variables that can change numerics between otherwise equal runs (section 3.2), as repro records
# them, and PyTorch's own.
NUMERICS_ENV_VARS = sorted([
    "CANDLE_GRAD_DO_NOT_DETACH", "CANDLE_NUM_THREADS", "CUBLAS_WORKSPACE_CONFIG", "CUDA_LAUNCH_BLOCKING",
    "CUDA_VISIBLE_DEVICES", "NVIDIA_TF32_OVERRIDE", "OMP_NUM_THREADS", "RAYON_NUM_THREADS", "REPRO_TF32",
    "NCCL_ALGO", "NCCL_BUFFSIZE", "NCCL_COLLNET_ENABLE", "NCCL_IB_DISABLE", "NCCL_MAX_CTAS",
    "NCCL_MAX_NCHANNELS", "NCCL_MIN_CTAS", "NCCL_MIN_NCHANNELS", "NCCL_NTHREADS", "NCCL_NVLS_ENABLE",
    "NCCL_P2P_DISABLE", "NCCL_PROTO", "NCCL_SHM_DISABLE", "MKL_NUM_THREADS",
    "TORCH_CUDNN_V8_API_DISABLED", "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE",
])
# The collectives a record can be the result of (section 10): the elementwise sum over the ranks
# (`collective`, format 1.3), and this rank's block of it (format 1.8, written as the record's
# `reduce_scatter` key with the value `sum`; its `shard` says which block).
ALL_REDUCE_SUM = "all_reduce_sum"
REDUCE_SCATTER_SUM = "reduce_scatter_sum"
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


class WriteError(Exception):
    """A request the writer refuses (bad name, shape, bytes, or a directory it will not touch)."""


@dataclass
class Record:
    """One tensor of a step: what it is, and its canonical element bytes (section 5.1); or,
    for a tensor kept as a hash only, `data` None and `data_hash` the data hash of those bytes
    (section 5.2), of the trace's kind (`TraceWriter.data_hash`), computed where the tensor
    lives."""

    name: str
    kind: str
    dtype: str
    shape: Sequence[int]
    data: Optional[bytes]
    phase: Optional[str] = None
    inputs: Sequence[str] = ()
    node: Optional[int] = None
    source: Optional[str] = None
    data_hash: Optional[bytes] = None
    # A captured node that reads an earlier record's memory (format 1.5): (owner name, offset,
    # strides); its hash is derived from the owner's, and it has no data of its own.
    view: Optional[tuple] = None
    # The result of a collective across the ranks of a data-parallel run (format 1.3):
    # `all_reduce_sum`, its one input this rank's contribution (section 10).
    collective: Optional[str] = None
    # One rank's block of a tensor sharded across the ranks (format 1.7): (the whole's shape,
    # the block's offset in it, one index per dimension); the record's shape is the block's.
    shard: Optional[tuple] = None
    # A shard that is this rank's block of a sum across the ranks (format 1.8): `sum`, its one
    # input this rank's whole contribution (section 10.2).
    reduce_scatter: Optional[str] = None


@dataclass
class Environment:
    """The header's environment (section 3.2). A PyTorch run puts torch's version where repro
    puts candle's, and leaves `rustc` empty."""

    repro_version: str = f"repro-py {VERSION}"
    candle_version: str = ""
    device: str = "cpu"
    device_name: str = ""
    cpu_model: str = ""
    os: str = f"{platform.system().lower()} {platform.machine()}"
    rustc: str = ""
    threads: int = 1
    env: dict = field(default_factory=lambda: {k: os.environ[k] for k in NUMERICS_ENV_VARS if k in os.environ})


def cpu_model() -> str:
    """The host's CPU model, as /proc/cpuinfo names it (empty where there is none)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return _CONTROL.sub("?", line.split(":", 1)[1].strip())
    except OSError:
        pass
    return ""


def _printable(what: str, text: str) -> None:
    if _CONTROL.search(text):
        raise WriteError(f"{what} {text!r} holds a control character, which reports would print to a terminal")


# The run settings a header keeps under their own keys (section 3.2's RunConfig); `params` holds
# every other.
RUN_KEYS = ("workload", "steps", "params")


def run_params(run: dict) -> dict:
    """The header's `params` of the run settings `run` (section 3.2: text by name, keys sorted):
    every setting but `workload` and `steps`, those of its `params` map and its other keys alike
    (`{"workload": "w", "seed": 0, "params": {"lr": 0.1}}` keeps `seed` and `lr`), each by
    `setting_text`. A setting given both ways is refused by name."""
    params = run.get("params") or {}
    if not isinstance(params, dict):
        raise WriteError(f"the run setting `params` is {type(params).__name__}, not a map of settings by name")
    settings: dict = {}
    for key, value in list(params.items()) + [(k, v) for k, v in run.items() if k not in RUN_KEYS]:
        key = str(key)
        if key in settings:
            raise WriteError(f"the run setting `{key}` is given twice, in `params` and beside it: keep one")
        settings[key] = setting_text(key, value)
    return dict(sorted(settings.items()))


def setting_text(key: str, value) -> str:
    """A run setting's value as a header keeps it: a string as itself, anything else JSON writes
    as its compact JSON text (`0`, `0.001`, `true`, `null`, `[32,4]`, `{"beta":0.9}`, a map's keys
    sorted), so that two runs' settings are equal exactly where their values are. What JSON
    cannot write (a function, an object) is refused, naming `key`."""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"))
    except (TypeError, ValueError):
        raise WriteError(
            f"the run setting `{key}` is {type(value).__name__} {value!r:.80}, which a trace's header cannot keep: "
            "give it as text, a number, a bool, None, or a list or map of them (str(value) where its text says "
            "what differs between runs)"
        ) from None


def capture_text(capture) -> str:
    """The canonical text of a capture policy given as text or as `repro.trace.parse_capture`
    gives it (a trace's header, read back)."""
    if isinstance(capture, str):
        return capture
    kind, arg = capture[0], capture[-1]
    if kind == "every":
        return f"every:{arg}"
    if kind == "steps":
        return "steps:" + ",".join(str(n) for n in arg)
    return kind


def step_policy(what: str, policy) -> tuple:
    """`policy`, a step policy given as text or as `repro.trace.parse_capture` gives it, parsed;
    a `WriteError` naming `what` where it is not one."""
    try:
        return parse_capture(capture_text(policy))
    except Exception:
        raise WriteError(f"{what} {policy!r} is not a step policy: one of {STEP_POLICY_FORMS}") from None


def _levels(modules, ops) -> dict:
    """The header capture policy's `modules` and `ops` keys: each policy given (not None) as its
    canonical text."""
    return {level: capture_text(step_policy(f"{level} policy", policy))
            for level, policy in (("modules", modules), ("ops", ops)) if policy is not None}


def policy_selects(policy: tuple, step: int, first: int, total: Optional[int]) -> bool:
    """Whether the step policy `policy` (as `repro.trace.parse_capture` gives it) selects step
    `step` of a run whose first recorded step is `first` and whose length is `total` (None where
    unknown: `first-and-last` then selects the first step alone; else its last step is
    `first + total - 1`, docs/trace-format.md section 6)."""
    kind, arg = policy[0], policy[-1]
    if kind == "none":
        return False
    if kind == "all":
        return True
    if kind == "first":
        return step == first
    if kind == "first-and-last":
        return step == first or (total is not None and total > 0 and step == first + total - 1)
    if kind == "every":
        return step % arg == 0
    return step in arg  # steps:A,B


class TraceWriter:
    """Writes one trace directory, crash-safely (section 4.3): a payload is written under a
    temporary name, synced and renamed before its step record is appended in one write; the
    footer is synced last. A second writer is refused while this one holds the lock.

    `data_hash`: how every tensor's data hash is computed, `blake3` (written as format 1.9, its
    header without the key) or `xxh3-1k` (format 2.0, the header saying so). `modules`, `ops`:
    the step policies of the capture ladder's levels (format 1.9: the steps that record every
    module's output, and every op's), written in the header's capture policy where given.
    `capture_names`: where given, the steps the capture policy names keep the values of the
    tensors of these names alone (every other tensor's hash only, as at any other step)."""

    def __init__(
        self,
        path: str,
        run: dict,
        capture: str = "first-and-last",
        inline_max_bytes: int = 256,
        replace: bool = False,
        environment: Optional[Environment] = None,
        producer: str = f"repro-py {VERSION}",
        distributed: Optional[dict] = None,
        data_hash: str = BLAKE3,
        modules=None,
        ops=None,
        capture_names=None,
    ):
        self.path = path
        self._names = frozenset(capture_names) if capture_names is not None else None
        params = run_params(run)  # refused before anything is written
        if data_hash not in DATA_HASHES:
            raise WriteError(f"data hash {data_hash!r} is not one of {', '.join(DATA_HASHES)}")
        try:  # the function the host hashes tensors with (a missing package found before anything is written)
            self._hash_data = data_hasher(data_hash)
        except ImportError as e:
            raise WriteError(str(e)) from None
        self.data_hash = data_hash
        self._format = FORMATS[data_hash]
        self._full = step_policy("capture policy", capture)
        capture = capture_text(capture)
        levels = _levels(modules, ops)
        self._capture = capture
        self._inline_max = inline_max_bytes
        self._total = run.get("steps")
        self._first: Optional[int] = None
        self._last: Optional[int] = None
        self._steps = 0
        self._checked: set = set()  # records whose checks of themselves alone passed (`_check`)
        # A shard of a world of one is its whole: no other rank holds the rest.
        self._world_size = 1 if distributed is None else int(distributed["world_size"])
        # The last step's layouts (`layout_of` of each record) and its records' encodings.
        self._layout: Optional[list] = None
        self._has_views = False
        self._encoded: list = []
        # `NativeRecords`, where repro's native library was found (`use_native_records`), and the
        # last step's layout as it takes it.
        self._native: Optional[NativeRecords] = None
        self._native_layout: Optional[_NativeLayout] = None
        self._prepare(replace)
        header = {
            "type": "header",
            "format": {"major": self._format[0], "minor": self._format[1]},
            "producer": producer,
            "run": {
                "workload": run["workload"],
                "steps": run.get("steps"),
                "params": params,
            },
            "environment": _environment(environment or Environment()),
            "capture": {"full": capture, "inline_max_bytes": inline_max_bytes, **levels},
        }
        if distributed is not None:
            header["distributed"] = distributed
        if data_hash != BLAKE3:
            header["data_hash"] = data_hash
        for what, text in [("the workload", header["run"]["workload"]), ("the producer", producer)] + [
            (f"setting {k}", f"{k}={v}") for k, v in header["run"]["params"].items()
        ]:
            _printable(what, text)
        self._records = open(os.path.join(path, RECORDS_FILE), "wb")
        self._records.write(MAGIC + struct.pack("<HH", *self._format))
        self._header = header
        self._append(header)

    def set_levels(self, modules, ops) -> None:
        """Makes the header's `modules` and `ops` step policies these (None: the key left out).
        Only a trace without steps may change them: its header, its one record, is written anew."""
        if self._steps:
            raise WriteError(f"{self.path}: the levels cannot change once a step is written")
        capture = self._header["capture"]
        self._header["capture"] = {"full": capture["full"], "inline_max_bytes": capture["inline_max_bytes"],
                                   **_levels(modules, ops)}
        self._records.seek(len(MAGIC) + 4)
        self._records.truncate()
        self._append(self._header)

    def _prepare(self, replace: bool) -> None:
        """Creates the directory, takes its lock, and clears an earlier trace when asked to (only
        the files a trace names: section 1)."""
        os.makedirs(self.path, exist_ok=True)
        self._lock = open(os.path.join(self.path, LOCK_FILE), "a")
        try:
            self._clear(replace)
        except BaseException:
            self._lock.close()
            raise

    def _clear(self, replace: bool) -> None:
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise WriteError(f"{self.path} is being written by another recorder (it holds {LOCK_FILE})") from None
        records = os.path.join(self.path, RECORDS_FILE)
        others = [n for n in os.listdir(self.path)
                  if n not in (LOCK_FILE, RECORDS_FILE, "run-meta.json", PROGRESS_FILE, TENSORS_DIR)]
        if os.path.lexists(records) and os.path.getsize(records) >= 12:
            if not replace:
                raise WriteError(f"{self.path} already holds a trace: pass replace=True (REPRO_REPLACE=1) to replace it")
            tensors = os.path.join(self.path, TENSORS_DIR)
            if os.path.isdir(tensors) and not os.path.islink(tensors):
                for name in os.listdir(tensors):
                    if re.fullmatch(r"step-\d{8,}\.safetensors(\.tmp)?", name):
                        os.remove(os.path.join(tensors, name))
                if not os.listdir(tensors):
                    os.rmdir(tensors)
            for name in (RECORDS_FILE, "run-meta.json", PROGRESS_FILE):
                if os.path.lexists(os.path.join(self.path, name)):
                    os.remove(os.path.join(self.path, name))
        elif others:
            raise WriteError(f"{self.path} is not empty and holds no trace: record into a new or empty directory")

    def _append(self, record: dict) -> None:
        self._append_packed(_pack(record))

    def _append_packed(self, payload: bytes) -> None:
        """Appends one record, already packed, as a frame."""
        if len(payload) > MAX_RECORD_BYTES:
            raise WriteError(f"a record of {len(payload)} bytes exceeds the format's {MAX_RECORD_BYTES}")
        length = struct.pack("<I", len(payload))
        crc = struct.pack("<I", zlib.crc32(payload, zlib.crc32(length)) & 0xFFFFFFFF)
        self._records.write(length + crc + payload)  # one write per frame (section 2.2)
        self._records.flush()

    def wants_full(self, step: int, first: Optional[int] = None) -> bool:
        """Whether step `step` stores full values (the capture policy; the first step written
        counts as the first, or `first` while none is written yet)."""
        first = self._first if self._first is not None else (first if first is not None else step)
        return policy_selects(self._full, step, first, self._total)

    def stores_values(self, name: str) -> bool:
        """Whether the steps that keep full values keep those of the tensor `name`
        (`capture_names`)."""
        return self._names is None or name in self._names

    def write_step(self, step: int, tensors: Iterable[Record], no_gradient: Iterable[str] = ()) -> None:
        """Writes one step: each tensor's hash, its bytes inline when small, in the step's payload
        file when the capture policy keeps this step. Checks everything before writing anything.

        Steps repeat: a step whose records are laid out as the last one's (the same names, kinds,
        dtypes, shapes, inputs, nodes, sources...: everything but the values) skips the checks of
        how its records relate, which the last step passed, and reuses their encoding."""
        tensors = tensors if isinstance(tensors, list) else list(tensors)
        self.write_laid_out(step, [layout_of(t) for t in tensors], [t.data for t in tensors],
                            [t.data_hash for t in tensors], no_gradient)

    def write_laid_out(self, step: int, layouts: list, data: list, hashes: list, no_gradient: Iterable[str] = ()) -> None:
        """`write_step` for records given as three lists: each record's layout (a tuple in the
        order of `LAYOUT_FIELDS`, as `layout_of` makes it), its bytes (or None) and its data hash
        (or None). A recorder that keeps its steps so makes no object per record that Python's
        garbage collector must walk while the step waits to be written."""
        if self._last is not None and step <= self._last:
            raise WriteError(f"step {step} follows step {self._last}: steps must increase")
        if not len(layouts) == len(data) == len(hashes):
            raise WriteError(f"step {step}: {len(layouts)} layouts, {len(data)} values and {len(hashes)} hashes")
        full_step = self.wants_full(step)
        full = full_step and self._names is None  # every record's values
        if layouts != self._layout:
            records = [_record_of(layout, d, h) for layout, d, h in zip(layouts, data, hashes)]
            self._check_layout(records, step)
            self._layout, self._encoded = [Layout._make(layout) for layout in layouts], [_EncodedRecord(t) for t in records]
            self._has_views = any(t.view is not None for t in records)
            self._native_layout = None
        layouts = self._layout  # the same, as `Layout`s
        digests, payload = {}, {}
        views = self._has_views  # the digests kept by name only for them to name
        missing = sorted(set(no_gradient))
        # The step record's map, key by key (`_append` of a dict would pack it alike).
        parts = [_STEP_OPENINGS[bool(missing)], _pack(step), _PAYLOAD_KEY, _NIL, _TENSORS_KEY,
                 _PACKER.pack_array_header(len(layouts))]
        # Natively where some records hold a data hash alone (the records given with their bytes,
        # the host's, are packed here either way).
        native = self._native is not None and not full_step and not views and None in data
        packed = self._natively_packed(step, layouts, data, hashes) if native else None
        if packed is not None:
            parts.append(packed)
            layouts = ()  # every record packed
        for layout, d, inner, encoded in zip(layouts, data, hashes, self._encoded):
            view = layout.view
            if view is not None:
                if d is not None:
                    raise WriteError(f"step {step}, tensor `{layout.name}`: a view is a node's, without data, of a "
                                     "tensor of its dtype recorded earlier in the step")
                of, offset, strides = view
                digest = view_hash(layout.dtype, encoded.shape, digests[of], int(offset), [int(x) for x in strides])
                parts += (encoded.opening, _str64(digest), encoded.closing)
                continue
            keep = full or full_step and self.stores_values(layout.name)
            if d is None:
                if not isinstance(inner, (bytes, bytearray)) or len(inner) != 32:
                    raise WriteError(f"step {step}, tensor `{layout.name}`: neither its bytes nor a 32-byte data hash")
                if keep:
                    raise WriteError(f"step {step}, tensor `{layout.name}`: the step stores full values, but only a "
                                     "hash was given")
                h = encoded.prefix.copy()
                h.update(inner)
                digest = hexlify(h.digest())  # as hexdigest(), as bytes, in less time
                parts += (encoded.opening, _STR64_HEADER, digest, encoded.closing)
            else:
                digest = self._add_with_bytes(parts, step, layout, d, encoded, keep, payload)
            if views:
                digests[layout.name] = digest.decode()
        if missing:
            parts += (_NO_GRADIENT_KEY, _pack(missing))
        if payload:
            name = payload_name(step)
            parts[3] = _pack(name)
            self._write_payload(name, payload)
        self._append_packed(b"".join(parts))
        if self._first is None:
            self._first = step
        self._last = step
        self._steps += 1

    def _add_with_bytes(self, parts: list, step: int, layout: tuple, d, encoded: "_EncodedRecord", full: bool,
                        payload: dict) -> bytes:
        """Adds to `parts` the packed record of a tensor given with its bytes `d`; its hash (hex,
        as bytes). Bytes over the inline limit go to the step's payload when it stores full values."""
        if len(d) != encoded.nbytes:
            raise WriteError(f"step {step}, tensor `{layout.name}`: {len(d)} bytes for {layout.dtype} "
                             f"{list(encoded.shape)} ({encoded.nbytes} expected)")
        h = encoded.prefix.copy()
        h.update(self._hash_data(d))
        digest = hexlify(h.digest())
        if len(d) <= self._inline_max:
            parts += (encoded.opening_inline, _STR64_HEADER, digest, _INLINE_KEY, _pack(bytes(d)), encoded.closing)
        else:
            parts += (encoded.opening, _STR64_HEADER, digest, encoded.closing_payload if full else encoded.closing)
            if full:
                payload[layout.name] = (layout.dtype, encoded.shape, d)
        return digest

    def use_native_records(self, native: "NativeRecords") -> None:
        """Packs the records of steps that keep no full values and name no views natively
        (`NativeRecords`), byte for byte as this writer's Python does."""
        self._native = native

    def _natively_packed(self, step: int, layouts: list, data: list, hashes: list) -> Optional[bytes]:
        """The step's records packed by `NativeRecords`: those given with their bytes packed here
        first (`_add_with_bytes`), the rest there in one call. None where a record holds neither
        bytes nor a 32-byte data hash (the Python loop then says which)."""
        inners, at, overrides = hashes, [], []
        if data.count(None) != len(data):
            inners = list(hashes)
            for i, d in enumerate(data):
                if d is not None:
                    parts: list = []
                    self._add_with_bytes(parts, step, layouts[i], d, self._encoded[i], False, {})
                    at.append(i)
                    overrides.append(b"".join(parts))
                    inners[i] = _NO_DATA_HASH
        try:
            joined = b"".join(inners)
        except TypeError:  # a None among them
            return None
        if set(map(len, inners)) - {32}:
            return None
        if self._native_layout is None:
            self._native_layout = _NativeLayout(layouts, self._encoded)
        return self._native.pack(self._native_layout, joined, at, overrides)

    def _check_layout(self, tensors: list, step: int) -> None:
        """The checks of a step's records that do not depend on their values: each record alone,
        and how the records relate (names once, inputs recorded before, collectives, views)."""
        seen, owners = set(), {}
        for t in tensors:
            self._check(t, seen, owners, step)
            seen.add(t.name)
            if t.view is None:
                owners[t.name] = t

    def _check(self, t: Record, seen: set, owners: dict, step: int) -> None:
        where = f"step {step}, tensor `{t.name}`"
        if t.name in seen:
            raise WriteError(f"{where}: recorded twice in the step")
        # What a record says of itself alone is checked once per writer: steps repeat it.
        alone = (t.name, t.kind, t.dtype, t.phase, len(t.shape), t.source)
        if alone not in self._checked:
            self._check_alone(t, where)
            self._checked.add(alone)
        for i in t.inputs:
            _printable("an input's name", i)
            if i not in seen:
                raise WriteError(f"{where}: input `{i}` is not recorded earlier in the step")
        if t.collective is not None or t.reduce_scatter is not None:
            self._check_collective(t, owners, where)
        if t.shard is not None:
            whole, offset = t.shard
            if t.view is not None or len(whole) != len(t.shape) or len(offset) != len(t.shape) or any(
                    int(o) < 0 or int(o) + int(d) > int(w) for o, d, w in zip(offset, t.shape, whole)):
                raise WriteError(f"{where}: its shard {list(t.shape)} at {list(offset)} does not lie within the "
                                 f"whole {list(whole)}")
            whole_bytes = DTYPE_SIZES[t.dtype]
            for d in whole:
                whole_bytes *= int(d)
            if whole_bytes > U64_MAX:
                raise WriteError(f"{where}: its shard's whole {list(whole)} holds more than 2^64 - 1 bytes")
            if self._world_size == 1 and (list(whole) != list(t.shape) or any(int(o) for o in offset)):
                raise WriteError(f"{where}: its shard {list(t.shape)} at {list(offset)} is part of a whole "
                                 f"{list(whole)}, but a trace of one device has no other rank to hold the rest")
        if t.view is not None:
            of, offset, strides = t.view
            owner = owners.get(of)
            if t.node is None or owner is None or owner.dtype != t.dtype:
                raise WriteError(f"{where}: a view is a node's, without data, of a tensor of its dtype recorded "
                                 "earlier in the step")
            elements = math.prod(int(d) for d in owner.shape)
            if len(strides) != len(t.shape) or not view_within([int(d) for d in t.shape], int(offset),
                                                                  [int(x) for x in strides], elements):
                raise WriteError(f"{where}: its view does not lie within `{of}`")

    @staticmethod
    def _check_alone(t: Record, where: str) -> None:
        """The checks of a record that need nothing else: its name, kind, dtype, phase, rank and
        source location."""
        _printable("tensor name", t.name)
        if t.kind not in KINDS:
            raise WriteError(f"{where}: unknown kind {t.kind!r} (expected one of {', '.join(sorted(KINDS))})")
        if t.dtype not in DTYPE_SIZES:
            raise WriteError(f"{where}: unknown dtype {t.dtype!r}")
        if t.phase is not None and t.phase not in PHASES:
            raise WriteError(f"{where}: unknown phase {t.phase!r}")
        if len(t.shape) > MAX_RANK:
            raise WriteError(f"{where}: rank {len(t.shape)} exceeds {MAX_RANK}")
        if t.source is not None:
            _printable("the source location", t.source)
            if len(t.source.encode()) > MAX_SOURCE_BYTES:
                raise WriteError(f"{where}: a source location is at most {MAX_SOURCE_BYTES} bytes")

    @staticmethod
    def _check_collective(t: Record, owners: dict, where: str) -> None:
        """A collective's result sums exactly one contribution of this rank, recorded earlier in
        the step with its dtype and the whole sum's shape: the record's own, or, for a
        reduce-scatter's block, its shard's whole (section 10)."""
        whole = t.shape
        if t.reduce_scatter is not None:
            if t.reduce_scatter != "sum" or t.collective is not None or t.shard is None:
                raise WriteError(f"{where}: a reduce-scatter's result is `sum`, a shard, and no other collective")
            whole = t.shard[0]
        elif t.collective != ALL_REDUCE_SUM:
            raise WriteError(f"{where}: unknown collective {t.collective!r} (expected {ALL_REDUCE_SUM})")
        share = owners.get(t.inputs[0]) if len(t.inputs) == 1 else None
        if share is None or share.dtype != t.dtype or [int(d) for d in share.shape] != [int(d) for d in whole]:
            raise WriteError(f"{where}: a collective's result names exactly one input, this rank's contribution, "
                             "recorded earlier in the step with its dtype and the whole sum's shape")

    def _write_payload(self, name: str, tensors: dict) -> None:
        """Writes the payload file `name` of `tensors`: name -> (dtype, shape, bytes)."""
        os.makedirs(os.path.join(self.path, TENSORS_DIR), exist_ok=True)
        final = os.path.join(self.path, name)
        tmp = final + ".tmp"
        buffers = {n: np.frombuffer(data, dtype=np.uint8) for n, (_, _, data) in tensors.items()}
        specs = {
            n: safetensors.TensorSpec(
                dtype=_SAFETENSORS_DTYPES[dtype], shape=[int(d) for d in shape],
                data_ptr=buffers[n].ctypes.data if buffers[n].nbytes else 0, data_len=buffers[n].nbytes,
            )
            for n, (dtype, shape, _) in tensors.items()
        }
        if os.path.lexists(tmp):
            os.remove(tmp)
        # Written straight from the tensors' own bytes (no copy of the whole file in memory),
        # then synced before the rename.
        safetensors.serialize_file(specs, tmp, None)
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, final)

    def finish(self, stopped: Optional[str] = None) -> int:
        """Writes the footer (with `stopped`, a run that ended early on purpose), syncs the record
        file and releases the lock; returns the number of steps written."""
        footer = {"type": "footer", "steps": self._steps}
        if stopped is not None:
            _printable("the reason it stopped", stopped)
            footer["stopped"] = stopped
        self._append(footer)
        os.fsync(self._records.fileno())
        self._records.close()
        try:
            os.remove(os.path.join(self.path, PROGRESS_FILE))
        except FileNotFoundError:
            pass
        self._lock.close()
        return self._steps

    def mark_progress(self, step: int, at: str, collective: Optional[str] = None, tensors=()) -> None:
        """Says in `progress.json` (section 10.1) where the recorder is: in step `step` computing
        (`at` "computing"), waiting in a `collective` over `tensors` ("collective"), or done with
        the step ("done"). Replaced whole through a rename; removed when the trace is finished."""
        if at not in PROGRESS_POINTS:
            raise WriteError(f"progress point {at!r} is not one of {', '.join(PROGRESS_POINTS)}")
        mark = {"step": int(step), "at": at}
        if at == "collective":
            mark["collective"] = collective
            mark["tensors"] = list(tensors)
        path = os.path.join(self.path, PROGRESS_FILE)
        with open(f"{path}.tmp", "w") as f:
            json.dump(mark, f)
            f.write("\n")
        os.replace(f"{path}.tmp", path)


def _pack(value) -> bytes:
    return msgpack.packb(value, use_bin_type=True)


_PACKER = msgpack.Packer(use_bin_type=True)
_NIL = _pack(None)
_PAYLOAD_KEY, _TENSORS_KEY, _INLINE_KEY, _NO_GRADIENT_KEY = (_pack(k) for k in ("payload", "tensors", "inline", "no_gradient"))
_IN_PAYLOAD, _NOT_IN_PAYLOAD = _pack("in_payload") + _pack(True), _pack("in_payload") + _pack(False)
# A step record's map header and first key and value, then its `step` key: without and with
# `no_gradient`.
_STEP_OPENINGS = {has: _PACKER.pack_map_header(5 if has else 4) + _pack("type") + _pack("step") + _pack("step")
                  for has in (False, True)}


# A string of 64 characters as msgpack packs it: its header, then its bytes.
_STR64_HEADER = b"\xd9\x40"


def _str64(digest: str) -> bytes:
    """A hex digest (64 characters) as msgpack packs it."""
    return _STR64_HEADER + digest.encode("ascii")


# The fields of a record's layout, in order: everything a record is but its values, what
# `_check_layout` checks and `_EncodedRecord` encodes. Shapes, inputs, a view's strides and a
# shard's shapes are tuples of plain ints and strings, so that equal layouts compare equal.
# `collective` names the collective the record is the result of (`ALL_REDUCE_SUM` or
# `REDUCE_SCATTER_SUM`), whichever key the format writes it under.
class Layout(NamedTuple):
    """A record's layout: everything it is but its values (see above), by name and in
    `LAYOUT_FIELDS`' order (a plain tuple of the same values is the same layout)."""

    name: str
    kind: str
    dtype: str
    shape: tuple
    phase: Optional[str]
    inputs: tuple
    node: Optional[int]
    source: Optional[str]
    collective: Optional[str]
    view: Optional[tuple]
    shard: Optional[tuple]


LAYOUT_FIELDS = Layout._fields


def layout_of(t: Record) -> Layout:
    """A record's layout (`LAYOUT_FIELDS`)."""
    view = None if t.view is None else (t.view[0], int(t.view[1]), tuple(int(x) for x in t.view[2]))
    shard = None if t.shard is None else (tuple(int(d) for d in t.shard[0]), tuple(int(o) for o in t.shard[1]))
    collective = t.collective
    if t.reduce_scatter is not None:
        if t.reduce_scatter != "sum" or t.collective is not None:
            raise WriteError(f"tensor `{t.name}`: a reduce-scatter's result is `sum`, and no other collective")
        collective = REDUCE_SCATTER_SUM
    return Layout(t.name, t.kind, t.dtype, tuple(int(d) for d in t.shape), t.phase, tuple(t.inputs), t.node, t.source,
                  collective, view, shard)


def _record_of(layout: tuple, data, data_hash) -> Record:
    name, kind, dtype, shape, phase, inputs, node, source, collective, view, shard = layout
    reduce_scatter = None
    if collective == REDUCE_SCATTER_SUM:
        collective, reduce_scatter = None, "sum"
    return Record(name, kind, dtype, shape, data, phase, inputs, node, source, data_hash, view, collective, shard,
                  reduce_scatter)


class NativeRecords:
    """`repro_pack_hashed_records` of repro's native library (`librepro_cuda_hash.so`, built by
    `make cuda`, or without its GPU half by `cargo build --release -p repro-cuda-hash`; see
    python/cuda-hash/src/records.rs): a step's records packed in one call."""

    def __init__(self, path: str):
        """Raises WriteError where the library cannot be loaded or lacks the function (a
        library built before it)."""
        try:
            function = ctypes.CDLL(path).repro_pack_hashed_records
        except (OSError, AttributeError) as e:
            raise WriteError(f"repro's native library {path} cannot pack records: {e}") from None
        words, text = ctypes.POINTER(ctypes.c_uint64), ctypes.c_char_p
        function.argtypes = [text, words, text, words, text, ctypes.c_uint64, text, words, words, ctypes.c_uint64,
                             ctypes.POINTER(ctypes.c_char), ctypes.c_uint64]
        function.restype = ctypes.c_int64
        self._function = function

    def pack(self, layout: "_NativeLayout", data_hashes: bytes, at: list, overrides: list) -> bytes:
        """The records of `layout` packed, each with its data hash (32 bytes each, in order,
        joined), but those at indices `at`, given whole in `overrides`."""
        k = len(at)
        out = ctypes.create_string_buffer(layout.size + sum(map(len, overrides)))
        written = self._function(layout.prefixes, layout.prefix_ends, layout.pieces, layout.piece_ends, data_hashes,
                                 layout.n, b"".join(overrides), _words(itertools.accumulate(map(len, overrides)), k),
                                 _words(at, k), k, out, len(out))
        if written < 0:
            raise WriteError("repro's native library refused a step's records (a writer's bug: please report it)")
        return out.raw[:written]


def _words(values, n: int):
    return (ctypes.c_uint64 * n)(*values)


# The data hash passed for a record packed whole by the writer, which the library does not read.
_NO_DATA_HASH = bytes(32)


class _NativeLayout:
    """A layout's records as `NativeRecords` takes them: each one's canonical hash prefix, and
    its encoding before its hash and after it, all joined, with their ends; and the bytes they
    take packed."""

    def __init__(self, layouts: list, encoded: list):
        prefixes = [tensor_hash_prefix(layout.dtype, e.shape) for layout, e in zip(layouts, encoded)]
        pieces = [piece for e in encoded for piece in (e.opening, e.closing)]
        self.n = len(prefixes)
        self.prefixes, self.prefix_ends = b"".join(prefixes), _words(itertools.accumulate(map(len, prefixes)), self.n)
        self.pieces, self.piece_ends = b"".join(pieces), _words(itertools.accumulate(map(len, pieces)), 2 * self.n)
        self.size = len(self.pieces) + 66 * self.n  # and each hash, its string header first


class _EncodedRecord:
    """A step record's tensor map, packed but for its values (section 3.3): its keys before
    `hash`, and those after `in_payload` (or `inline`); and the hash state after its dtype and
    shape (section 5)."""

    def __init__(self, t: Record):
        self.shape = [int(d) for d in t.shape]
        self.nbytes = DTYPE_SIZES[t.dtype] * math.prod(self.shape)
        self.prefix = tensor_hasher(t.dtype, self.shape)
        self.head = b"".join(_pack(x) for x in ("name", t.name, "kind", t.kind, "dtype", t.dtype, "shape", self.shape, "hash"))
        tail = {}
        if t.phase is not None:
            tail["phase"] = t.phase
        if t.inputs:
            tail["inputs"] = list(t.inputs)
        if t.node is not None:
            tail["node"] = int(t.node)
        if t.collective is not None:
            tail["collective"] = t.collective
        if t.source is not None:
            tail["source"] = t.source
        if t.view is not None:
            of, offset, strides = t.view
            tail["view"] = {"of": of, "offset": int(offset), "strides": [int(x) for x in strides]}
        if t.shard is not None:
            whole, offset = t.shard
            tail["shard"] = {"whole": [int(d) for d in whole], "offset": [int(o) for o in offset]}
        if t.reduce_scatter is not None:
            tail["reduce_scatter"] = t.reduce_scatter
        self.tail = b"".join(_pack(k) + _pack(v) for k, v in tail.items())
        keys = 6 + len(tail)  # name, kind, dtype, shape, hash, in_payload
        # Up to the hash's value (without and with `inline`), and from `in_payload` on.
        self.opening = _PACKER.pack_map_header(keys) + self.head
        self.opening_inline = _PACKER.pack_map_header(keys + 1) + self.head
        self.closing, self.closing_payload = _NOT_IN_PAYLOAD + self.tail, _IN_PAYLOAD + self.tail


def _environment(e: Environment) -> dict:
    for what, text in [("the device name", e.device_name), ("the CPU model", e.cpu_model)]:
        _printable(what, text)
    return {
        "repro_version": e.repro_version,
        "candle_version": e.candle_version,
        "device": e.device,
        "device_name": e.device_name,
        "cpu_model": e.cpu_model,
        "os": e.os,
        "rustc": e.rustc,
        "threads": int(e.threads),
        "env": dict(sorted(e.env.items())),
    }
