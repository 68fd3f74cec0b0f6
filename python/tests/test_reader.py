"""The reader's numpy access: a tensor by name at a step, as the array it was written from
(every dtype, BF16 widened to float32 exactly, views through their owner's values), on traces
the Python writer makes and on one repro records; a reduce-scatter record refused by both readers
unless it is a block of an earlier whole; a buffer read as one, and refused by both readers in a
file that declares a format before it; the capture ladder's levels in the header read back as
step policies, and refused before format 1.9 or when no policy. Needs REPRO_BIN (a built repro)
and the reader's packages."""

import os
import shutil
import struct
import subprocess
import sys
import tempfile
import unittest
import zlib

import numpy as np

from repro.trace import Corrupt, Trace, read_tensor
from repro.writer import Record, TraceWriter

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from record_file import frames_of, rewrite_header  # noqa: E402

REPRO = os.environ.get("REPRO_BIN", "target/release/repro")

# One array a dtype, in the numpy type the reader gives it back as.
ARRAYS = {
    "U8": np.array([[0, 255, 7], [1, 2, 3]], np.uint8),
    "U32": np.array([0, 2**32 - 1, 12345], np.uint32),
    "I16": np.array([-(2**15), 2**15 - 1, -1], np.int16),
    "I32": np.array([[-(2**31)], [2**31 - 1]], np.int32),
    "I64": np.array([-(2**63), 2**63 - 1, 0, -5], np.int64),
    "F16": np.array([1.5, -0.0, np.inf, 6.0e-8], np.float16),
    "F32": np.arange(35, dtype=np.float32).reshape(5, 7) / 3,
    "F64": np.array([[np.pi, -1e300], [5e-324, -0.0]], np.float64),
}


def bf16_bits(values: np.ndarray) -> np.ndarray:
    """The bfloat16 bits of float32 values: their upper halves (each value rounded toward zero)."""
    return (values.astype(np.float32).view(np.uint32) >> 16).astype("<u2")


class ReadTensorTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="repro-reader-")

    def tearDown(self):
        shutil.rmtree(self.dir)

    def assert_same_bits(self, got: np.ndarray, expected: np.ndarray):
        self.assertEqual((got.dtype, got.shape), (expected.dtype, expected.shape))
        self.assertEqual(got.tobytes(), expected.tobytes())

    def test_every_dtype_reads_back_as_the_array_written(self):
        path = os.path.join(self.dir, "dtypes")
        # Small tensors inline, the larger ones in the step's payload file: both are read.
        w = TraceWriter(path, {"workload": "dtypes", "steps": 1}, capture="all", inline_max_bytes=16)
        records = [Record(d, "weight", d, list(a.shape), a.astype(a.dtype.newbyteorder("<")).tobytes())
                   for d, a in ARRAYS.items()]
        # BF16 covers signed zero, infinity, NaN, the largest finite value and a subnormal.
        bits = bf16_bits(np.array([1.0, -0.0, np.inf, np.nan, 3.3895314e38, 9.18355e-41, -2.5], np.float32))
        records.append(Record("BF16", "weight", "BF16", [7], bits.tobytes()))
        records.append(Record("loss", "loss", "F32", [], struct.pack("<f", 0.25)))
        w.write_step(0, records)
        w.finish()
        for dtype, expected in ARRAYS.items():
            self.assert_same_bits(read_tensor(path, 0, dtype), expected)
        bf16 = read_tensor(path, 0, "BF16")
        self.assertEqual((bf16.dtype, bf16.shape), (np.float32, (7,)))
        self.assertEqual(bf16.view(np.uint32).tolist(), (bits.astype(np.uint32) << 16).tolist())
        self.assertEqual(bf16[[0, 2, 4, 6]].tolist(), [1.0, np.inf, 2.0**127 * (2 - 2.0**-7), -2.5])
        self.assertTrue(np.isnan(bf16[3]) and np.signbit(bf16[1]) and bf16[5] == 2.0**-133)
        loss = read_tensor(path, 0, "loss")
        self.assertEqual((loss.shape, float(loss)), ((), 0.25))

    def test_a_reduce_scatter_is_refused_by_both_readers_unless_a_block_of_an_earlier_whole(self):
        import msgpack

        path = os.path.join(self.dir, "scatter")
        rank = {"rank": 0, "world_size": 2, "backend": "file", "backend_version": ""}
        w = TraceWriter(path, {"workload": "scatter", "steps": 1}, distributed=rank)
        w.write_step(0, [Record("g.local", "gradient", "F32", [4], struct.pack("<4f", 1, 2, 3, 4)),
                         Record("g", "gradient", "F32", [2], struct.pack("<2f", 3, 4), inputs=["g.local"],
                                shard=([4], [2]), reduce_scatter="sum")])
        w.finish()
        with Trace(path) as t:
            g = next(iter(t.steps())).tensors[1]
        self.assertEqual((g.reduce_scatter, g.inputs, g.shard.whole), ("sum", ["g.local"], [4]))
        records = os.path.join(path, "records.rpr")
        with open(records, "rb") as f:
            good = f.read()
        frames, at = [], 12  # the preamble, then (length, checksum, payload) frames
        while at < len(good):
            length = struct.unpack_from("<I", good, at)[0]
            frames.append(good[at + 8:at + 8 + length])
            at += 8 + length

        def framed(payload: bytes) -> bytes:
            length = struct.pack("<I", len(payload))
            return length + struct.pack("<I", zlib.crc32(payload, zlib.crc32(length)) & 0xFFFFFFFF) + payload

        def with_block(change):
            """The trace again, its step's block changed by `change` (and framed correctly)."""
            step = msgpack.unpackb(frames[1], raw=False)
            change(step["tensors"][1])
            changed = [frames[0], msgpack.packb(step, use_bin_type=True), *frames[2:]]
            with open(records, "wb") as f:
                f.write(good[:12] + b"".join(map(framed, changed)))

        for change, says in (
            (lambda t: t.update(reduce_scatter="max"), "reduce-scatter"),
            (lambda t: t.pop("shard"), "no `shard`"),
            (lambda t: t.update(collective="all_reduce_sum"), "carries `collective` and `reduce_scatter`"),
            (lambda t: t.update(shard={"whole": [6], "offset": [2]}), "the sum F32 [6]"),
        ):
            with_block(change)
            self.assert_both_readers_refuse(path, says)

    def assert_both_readers_refuse(self, path: str, says: str):
        """Asserts that this reader and `repro inspect` refuse the trace `path` as corrupt, saying `says`."""
        with self.assertRaises(Corrupt) as e, Trace(path) as t:
            list(t.steps())
        self.assertIn(says, str(e.exception))
        run = subprocess.run([REPRO, "inspect", path], capture_output=True, text=True)
        self.assertEqual(run.returncode, 2, run.stdout + run.stderr)
        self.assertIn(says, run.stderr)

    def test_a_buffer_reads_as_one_and_is_refused_in_a_file_that_declares_1_8(self):
        path = os.path.join(self.dir, "buffers")
        w = TraceWriter(path, {"workload": "buffers", "steps": 1})
        w.write_step(0, [Record("bn.num_batches_tracked", "buffer", "I64", [], struct.pack("<q", 3), phase="forward"),
                         Record("bn.running_mean.updated", "buffer", "F32", [2], struct.pack("<2f", 0.5, 1),
                                phase="update")])
        w.finish()
        with Trace(path) as t:
            self.assertEqual(t.version, (1, 10))
            kinds = [(x.name, x.kind) for x in next(iter(t.steps())).tensors]
        self.assertEqual(kinds, [("bn.num_batches_tracked", "buffer"), ("bn.running_mean.updated", "buffer")])
        self.assertEqual(int(read_tensor(path, 0, "bn.num_batches_tracked")), 3)
        run = subprocess.run([REPRO, "inspect", path, "--verify"], capture_output=True, text=True)
        self.assertEqual(run.returncode, 0, run.stdout + run.stderr)
        # The same trace declared 1.8, whose readers would read its buffers as `other`.
        records = os.path.join(path, "records.rpr")
        rewrite_header(records, *frames_of(records), (1, 8))
        self.assert_both_readers_refuse(path, "the kind `buffer` is of format 1.9, but the file declares 1.8")

    def test_optimizer_and_rng_state_read_as_such_and_are_refused_in_files_that_declare_1_9_or_2_0(self):
        for data_hash, older in (("blake3", (1, 9)), ("xxh3-1k", (2, 0))):
            path = os.path.join(self.dir, f"state-{data_hash}")
            w = TraceWriter(path, {"workload": "state", "steps": 1}, data_hash=data_hash)
            w.write_step(0, [Record("rng.cpu", "rng_state", "U8", [4], bytes([1, 2, 3, 4]), phase="forward"),
                             Record("0.weight.exp_avg", "optimizer_state", "F32", [2], struct.pack("<2f", 0.5, 1),
                                    phase="update")])
            w.finish()
            with Trace(path) as t:
                self.assertEqual(t.version, (1, 10) if data_hash == "blake3" else (2, 1))
                kinds = [(x.name, x.kind) for x in next(iter(t.steps())).tensors]
            self.assertEqual(kinds, [("rng.cpu", "rng_state"), ("0.weight.exp_avg", "optimizer_state")])
            run = subprocess.run([REPRO, "inspect", path, "--verify"], capture_output=True, text=True)
            self.assertEqual(run.returncode, 0, run.stdout + run.stderr)
            # Declared one minor version older, whose readers would read them as `other`.
            records = os.path.join(path, "records.rpr")
            rewrite_header(records, *frames_of(records), older)
            self.assert_both_readers_refuse(path, "the kind `rng_state` is of format 1.10 (2.1 under xxh3-1k), but the "
                                            f"file declares {older[0]}.{older[1]}")

    def test_the_capture_levels_read_back_and_are_refused_in_a_file_that_declares_1_8_or_as_no_policy(self):
        import msgpack

        from repro.writer import WriteError, policy_selects

        # `first` is the first step recorded; `first-and-last`'s last, `first + steps - 1`.
        self.assertEqual([s for s in range(20) if policy_selects(("first",), s, 5, 8)], [5])
        self.assertEqual([s for s in range(20) if policy_selects(("first-and-last",), s, 5, 8)], [5, 12])

        def header_of(path):
            with Trace(path) as t:
                return t.header["capture"]

        # Written where given, canonical, and read back parsed; left out where not given.
        levels = os.path.join(self.dir, "levels")
        w = TraceWriter(levels, {"workload": "levels", "steps": 3}, capture="first", modules="first",
                        ops="steps:2,1")
        self.assertEqual([w.wants_full(step, first=0) for step in range(3)], [True, False, False])
        w.finish()
        self.assertEqual(header_of(levels), {"full": ("first",), "inline_max_bytes": 256, "modules": ("first",),
                                             "ops": ("steps", [1, 2])})
        preamble, frames = frames_of(os.path.join(levels, "records.rpr"))
        self.assertEqual(msgpack.unpackb(frames[0], raw=False)["capture"],
                         {"full": "first", "inline_max_bytes": 256, "modules": "first", "ops": "steps:1,2"})
        plain = os.path.join(self.dir, "plain")
        TraceWriter(plain, {"workload": "plain"}).finish()
        self.assertEqual((header_of(plain)["modules"], header_of(plain)["ops"]), (None, None))
        with self.assertRaisesRegex(WriteError, "ops policy 'every:0' is not a step policy: one of none, all, first, "):
            TraceWriter(os.path.join(self.dir, "refused"), {"workload": "refused"}, ops="every:0")

        def rewritten(change, minor=9):
            rewrite_header(os.path.join(levels, "records.rpr"), preamble, frames, (1, minor),
                           lambda header: change(header["capture"]))

        for change, minor, says in (
            (lambda c: None, 8, "capture `modules` is a key of format 1.9, but the file declares 1.8"),
            (lambda c: [c.pop("modules"), c.pop("ops")], 8,
             "capture `full`: the policy `first` is of format 1.9, but the file declares 1.8"),
            (lambda c: c.update(ops="sometimes"), 9, "capture `ops` 'sometimes' is not a step policy"),
            (lambda c: c.update(modules=3), 9, "capture `modules` must be a string"),
        ):
            rewritten(change, minor)
            with self.assertRaises(Corrupt) as e, Trace(levels) as t:
                list(t.steps())
            self.assertIn(says, str(e.exception))

    def test_a_view_reads_through_its_owner_and_a_hash_is_not_a_value(self):
        path = os.path.join(self.dir, "views")
        owner = np.arange(12, dtype=np.float32).reshape(3, 4)
        views = {  # name: (shape, offset, strides), and what it reads
            "w.t": (([4, 3], 0, [1, 4]), owner.T),
            "w.row1": (([4], 4, [1]), owner[1]),
            "w.row2.broadcast": (([2, 4], 8, [0, 1]), np.broadcast_to(owner[2], (2, 4))),
        }
        # Step 0 stores the owner's values; step 1 keeps its hash only.
        w = TraceWriter(path, {"workload": "views", "steps": 2}, capture="steps:0", inline_max_bytes=16)
        for step in range(2):
            records = [Record("w", "weight", "F32", [3, 4], owner.tobytes())]
            for node, (name, ((shape, offset, strides), _)) in enumerate(views.items()):
                records.append(Record(name, "op_output", "F32", shape, None, node=node, view=("w", offset, strides)))
            w.write_step(step, records)
        w.finish()
        for name, (_, expected) in views.items():
            self.assert_same_bits(read_tensor(path, 0, name), np.ascontiguousarray(expected))
            with self.assertRaises(LookupError) as e:
                read_tensor(path, 1, name)
            self.assertIn("only its hash", str(e.exception))
        with self.assertRaises(LookupError) as e:
            read_tensor(path, 0, "w.missing")
        self.assertIn("no tensor `w.missing`", str(e.exception))
        with self.assertRaises(LookupError) as e:
            read_tensor(path, 2, "w")
        self.assertIn("no step 2", str(e.exception))

    def test_repro_s_views_read_as_numpy_strides_say(self):
        path = os.path.join(self.dir, "gpt")
        run = subprocess.run([REPRO, "record", "--workload", "gpt", "--steps", "1", "--layers", "1", "--width", "32",
                              "--context", "16", "--batch", "2", "--capture", "all", "--out", path],
                             capture_output=True, text=True)
        self.assertEqual(run.returncode, 0, run.stderr)
        checked = 0
        with Trace(path) as t:
            for s in t.steps():
                by_name = {x.name: x for x in s.tensors}
                for x in s.tensors:
                    if x.view is None:
                        continue
                    owner = t.array(s, by_name[x.view.of]).reshape(-1)
                    item = owner.itemsize
                    expected = np.lib.stride_tricks.as_strided(owner[x.view.offset:], x.shape,
                                                               [k * item for k in x.view.strides])
                    self.assert_same_bits(t.array(s, x), np.ascontiguousarray(expected))
                    checked += 1
        self.assertGreater(checked, 0, "the gpt recorded no views")


if __name__ == "__main__":
    unittest.main()
