"""Every knob of a recorder in one object, `RecordOptions` (with the flush policy's in
`FlushOptions`), and the one place the environment is read for them: `from_environment`, which
`Recorder.create_or_gated` and the integrations call (a repro command running the program sets
the variables: `repro record -- CMD`, `gate -- CMD`, `bisect -- CMD`). A recorder made directly
reads no environment variable."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Mapping, Optional

from repro.trace import BLAKE3, DATA_HASHES, STEP_POLICY_FORMS
from repro.writer import WriteError, step_policy

# The variables a repro command sets for the program it runs, by the option each sets.
CAPTURE_ENV = "REPRO_CAPTURE"
LEVEL_ENV = {"modules": "REPRO_MODULES", "ops": "REPRO_OPS"}
# The data hash a repro command asks a program to record with (`repro record --data-hash`).
DATA_HASH_ENV = "REPRO_DATA_HASH"
# The last step a repro command asks a program to record (`repro bisect` re-recording a pair of
# runs down to the step where they first differ): the recorder finishes the trace there, marked
# as stopped on purpose, and ends the program (exit status 0).
STOP_AFTER_ENV = "REPRO_STOP_AFTER"
REPLACE_ENV = "REPRO_REPLACE"
# The tensors whose full values the capture steps keep, by name, comma-separated (`repro bisect`
# recording the first tensors two runs differ in: their values alone, not a whole step's).
CAPTURE_NAMES_ENV = "REPRO_CAPTURE_NAMES"
# The flush policy, for measuring the policies against each other (python/bench/torch_cost.py).
FLUSH_ENV = "REPRO_TORCH_FLUSH"

FLUSH_MODES = ("batched", "module")


@dataclass(frozen=True)
class FlushOptions:
    """When the module outputs a step queues for hashing on a GPU are read (`flushes`): the
    policy, and the caps on what the recorder holds until then."""

    # `batched` (queued outputs read together, in order with the program's stream) or `module`
    # (every output at its hook): `flushes`' documentation.
    mode: str = "batched"
    # Outputs queued before a flush is forced (a flush costs the host some 100 us, whatever it
    # reads: resnet50 at batch 64 on an H200 machine, 4.1 ms for 31 flushes a step).
    max_queued: int = 256
    # The memory the recorder may keep that the program would have let go of: this share of
    # PyTorch's peak allocated memory so far, read as each step starts, within [extra_min_bytes,
    # max_queued_bytes] (max_queued_bytes where it cannot be read); and the outputs held,
    # whatever the measure says, up to max_held_bytes.
    extra_share: float = 0.03
    extra_min_bytes: int = 4 << 20
    max_queued_bytes: int = 256 << 20
    max_held_bytes: int = 1 << 30
    # The largest output changed in place that is copied at its hook; a larger one is read there.
    copy_at_hook_max_bytes: int = 64 << 20

    def __post_init__(self):
        if self.mode not in FLUSH_MODES:
            raise WriteError(f"flush mode {self.mode!r}: expected one of {', '.join(FLUSH_MODES)}")


@dataclass(frozen=True)
class RecordOptions:
    """What a recorder records, and how (`Recorder(path, run, options)`)."""

    # The steps that keep full values besides hashes: a step policy (`none`, `all`, `first`,
    # `first-and-last`, `every:N`, `steps:A,B,...`).
    capture: str = "first-and-last"
    # Where not None, the capture steps keep the full values of the tensors of these names alone
    # (every other tensor's hash, as at any step).
    capture_names: Optional[tuple] = None
    # The capture ladder's levels: the steps that record every module's output (a
    # `ModelRecorder`'s hooks) and every aten op's output (`ops.OpOutputs`), as step policies.
    modules: str = "first"
    ops: str = "none"
    # How tensors' data are hashed: `blake3`, or `xxh3-1k` (docs/trace-format.md, section 5.5).
    data_hash: str = BLAKE3
    # Hash CUDA tensors on their GPU (True: an error where repro's GPU hashing library is not
    # found), on the host (False), or on the GPU where the library is found (None).
    device_hashing: Optional[bool] = None
    # Values of at most this many bytes are kept inline in the records, larger ones in payloads.
    inline_max_bytes: int = 256
    # Whether a trace already at the path is replaced (otherwise it is an error).
    replace: bool = False
    # The last step to record: the trace is finished once it is written (its footer says it
    # stopped on purpose) and the program ends (`SystemExit(0)`).
    stop_after: Optional[int] = None
    flush: FlushOptions = field(default_factory=FlushOptions)

    def __post_init__(self):
        step_policy("capture policy", self.capture)
        if self.capture_names is not None and (isinstance(self.capture_names, str) or not all(
                isinstance(n, str) and n for n in self.capture_names)):
            raise WriteError(f"capture_names={self.capture_names!r}: expected a tuple of tensor names")
        step_policy("modules policy", self.modules)
        step_policy("ops policy", self.ops)
        if self.data_hash not in DATA_HASHES:
            raise WriteError(f"data_hash={self.data_hash!r}: expected one of {', '.join(DATA_HASHES)}")
        if self.stop_after is not None and (isinstance(self.stop_after, bool) or not isinstance(self.stop_after, int)
                                            or self.stop_after < 0):
            raise WriteError(f"stop_after={self.stop_after!r}: expected a step number (an integer, 0 or more)")

    def but(self, **changes) -> "RecordOptions":
        """These options with `changes` (option names as keywords; a None leaves that option as it
        is); a `TypeError` naming an unknown one."""
        names = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(changes) - names)
        if unknown:
            raise TypeError(f"unknown recorder option(s): {', '.join(unknown)} (RecordOptions has {', '.join(sorted(names))})")
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})


def from_environment(options: RecordOptions, env: Mapping[str, str] = os.environ) -> RecordOptions:
    """`options` with what a repro command running this program asks for in `env` (REPRO_CAPTURE,
    REPRO_CAPTURE_NAMES, REPRO_MODULES, REPRO_OPS, REPRO_DATA_HASH, REPRO_STOP_AFTER, REPRO_REPLACE,
    REPRO_TORCH_FLUSH); a `WriteError` naming the variable where its value is not one."""
    asked: dict = {}
    for option, variable in (("capture", CAPTURE_ENV), *LEVEL_ENV.items()):
        if env.get(variable):
            try:
                step_policy(variable, env[variable])
            except WriteError:
                raise WriteError(f"{variable}={env[variable]}: expected a step policy, one of {STEP_POLICY_FORMS}") from None
            asked[option] = env[variable]
    if env.get(CAPTURE_NAMES_ENV):
        asked["capture_names"] = tuple(n for n in env[CAPTURE_NAMES_ENV].split(",") if n)
    if env.get(DATA_HASH_ENV):
        if env[DATA_HASH_ENV] not in DATA_HASHES:
            raise WriteError(f"{DATA_HASH_ENV}={env[DATA_HASH_ENV]}: expected one of {', '.join(DATA_HASHES)}")
        asked["data_hash"] = env[DATA_HASH_ENV]
    if env.get(STOP_AFTER_ENV):
        if not env[STOP_AFTER_ENV].isdigit():
            raise WriteError(f"{STOP_AFTER_ENV}={env[STOP_AFTER_ENV]}: expected a step number (0 or more)")
        asked["stop_after"] = int(env[STOP_AFTER_ENV])
    if env.get(REPLACE_ENV) not in (None, "", "0", "1"):
        raise WriteError(f"{REPLACE_ENV}={env[REPLACE_ENV]}: expected 1 or 0")
    if env.get(REPLACE_ENV) == "1":
        asked["replace"] = True
    if env.get(FLUSH_ENV):
        if env[FLUSH_ENV] not in FLUSH_MODES:
            raise WriteError(f"{FLUSH_ENV}={env[FLUSH_ENV]}: expected one of {', '.join(FLUSH_MODES)}")
        asked["flush"] = dataclasses.replace(options.flush, mode=env[FLUSH_ENV])
    return options.but(**asked)
