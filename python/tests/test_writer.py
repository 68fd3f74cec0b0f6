"""The Python writer against repro itself: what it writes, repro reads and verifies (the Rust
hash recomputed over Python-written bytes, for every dtype), and a run rewritten from Python is
byte-identical to repro's own. Needs REPRO_BIN (a built repro) and the reader's packages."""

import os
import shutil
import struct
import subprocess
import sys
import tempfile
import unittest

import numpy as np

from repro.trace import DTYPE_SIZES, Trace
from repro.writer import Environment, Record, TraceWriter, WriteError

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from record_file import frames_of  # noqa: E402

REPRO = os.environ.get("REPRO_BIN", "target/release/repro")
# repro's native library, which packs a step's records in one call: the GPU one where set (it
# has that part too), else the workspace's CPU build of it.
NATIVE_LIB = os.environ.get("REPRO_CUDA_HASH_LIB") or "target/release/librepro_cuda_hash.so"


def repro(*args, env=None):
    return subprocess.run([REPRO, *args], capture_output=True, text=True, env=env)


class WriterTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="repro-writer-")

    def tearDown(self):
        shutil.rmtree(self.dir)

    def test_progress_marks_replace_each_other_and_go_with_the_finished_trace(self):
        import json

        path = os.path.join(self.dir, "marks")
        w = TraceWriter(path, {"workload": "marks", "steps": 1}, capture="none")
        mark = os.path.join(path, "progress.json")
        w.mark_progress(0, "computing")
        w.mark_progress(0, "collective", "all_reduce_sum", ["w.grad"])
        with open(mark) as f:
            self.assertEqual(json.load(f), {"step": 0, "at": "collective", "collective": "all_reduce_sum",
                                            "tensors": ["w.grad"]})
        with self.assertRaises(WriteError):
            w.mark_progress(0, "sleeping")
        w.mark_progress(0, "done")
        with open(mark) as f:
            self.assertEqual(json.load(f), {"step": 0, "at": "done"})
        self.assertFalse(os.path.exists(mark + ".tmp"))
        w.finish()
        self.assertFalse(os.path.exists(mark))

    def test_every_dtype_hashes_as_repro_does(self):
        rng = np.random.default_rng(0)
        path = os.path.join(self.dir, "dtypes")
        w = TraceWriter(path, {"workload": "dtypes", "steps": 2}, capture="all", inline_max_bytes=16)
        for step in range(2):
            records = []
            for dtype, size in sorted(DTYPE_SIZES.items()):
                # Small ones inline, large ones in the payload file: both paths hashed.
                for name, shape in ((f"{dtype}.small", [2]), (f"{dtype}.large", [3, 5])):
                    n = size * int(np.prod(shape))
                    records.append(Record(name, "weight", dtype, shape, rng.bytes(n)))
            records.append(Record("scalar", "loss", "F32", [], struct.pack("<f", -0.0)))
            records.append(Record("empty", "activation", "BF16", [0, 4], b""))
            w.write_step(step, records)
        self.assertEqual(w.finish(), 2)
        run = repro("inspect", path, "--verify")
        self.assertEqual(run.returncode, 0, run.stdout + run.stderr)
        self.assertIn("format     1.10", run.stdout)

    def test_a_run_rewritten_from_python_is_byte_identical_to_repro_s(self):
        for name, args in (
            ("adder", ["--steps", "4", "--batch", "64"]),
            ("gpt", ["--workload", "gpt", "--steps", "2", "--layers", "1", "--width", "32", "--context", "16", "--batch", "2"]),
        ):
            original = os.path.join(self.dir, name)
            run = repro("record", "--out", original, "--capture", "all", *args)
            self.assertEqual(run.returncode, 0, run.stderr)
            rewritten = os.path.join(self.dir, name + "-py")
            with Trace(original) as t:
                h = t.header
                w = TraceWriter(
                    rewritten, h["run"], h["capture"]["full"], h["capture"]["inline_max_bytes"],
                    environment=Environment(**h["environment"]), producer=h["producer"],
                    modules=h["capture"]["modules"], ops=h["capture"]["ops"],
                )
                for s in t.steps():
                    records = [Record(x.name, x.kind, x.dtype, x.shape, None if x.view else t.values(s, x), x.phase,
                                      x.inputs, x.node, x.source,
                                      view=x.view and (x.view.of, x.view.offset, x.view.strides)) for x in s.tensors]
                    w.write_step(s.step, records, s.no_gradient)
                w.finish()
            for sub in ["records.rpr"] + [f"tensors/{f}" for f in sorted(os.listdir(os.path.join(original, "tensors")))]:
                with open(os.path.join(original, sub), "rb") as a, open(os.path.join(rewritten, sub), "rb") as b:
                    self.assertEqual(a.read(), b.read(), f"{name}: {sub} differs")
            self.assertEqual(repro("diff", original, rewritten).returncode, 0)

    def test_a_data_hash_computed_elsewhere_writes_the_same_record_as_the_bytes(self):
        # What the PyTorch recorder does for CUDA tensors: BLAKE3 of the bytes computed on the
        # GPU, only 32 bytes handed to the writer.
        import blake3

        rng = np.random.default_rng(1)
        tensors = [("w", "BF16", [3, 300]), ("b", "F32", [70]), ("tiny", "F32", [2])]
        data = {name: rng.bytes(DTYPE_SIZES[dtype] * int(np.prod(shape))) for name, dtype, shape in tensors}
        paths = []
        for by_hash in (False, True):
            path = os.path.join(self.dir, f"by-hash-{by_hash}")
            w = TraceWriter(path, {"workload": "hashes"}, capture="none")
            records = []
            for name, dtype, shape in tensors:
                if by_hash and len(data[name]) > 256:
                    records.append(Record(name, "weight", dtype, shape, None, data_hash=blake3.blake3(data[name]).digest()))
                else:
                    records.append(Record(name, "weight", dtype, shape, data[name]))
            w.write_step(0, records)
            w.finish()
            paths.append(path)
        with open(os.path.join(paths[0], "records.rpr"), "rb") as a, open(os.path.join(paths[1], "records.rpr"), "rb") as b:
            self.assertEqual(a.read(), b.read())
        # A step that stores full values needs the bytes; a hash must be 32 bytes.
        w = TraceWriter(os.path.join(self.dir, "full"), {"workload": "hashes"}, capture="all")
        for record, says in (
            (Record("w", "weight", "F32", [100], None, data_hash=b"\0" * 32), "stores full values"),
            (Record("w", "weight", "F32", [100], None, data_hash=b"\0" * 31), "32-byte data hash"),
        ):
            with self.assertRaises(WriteError) as e:
                w.write_step(0, [record])
            self.assertIn(says, str(e.exception))
        w.finish()

    def test_steps_given_as_layouts_write_what_their_records_write(self):
        # `write_laid_out` is how repro.torch writes (no object per record); `write_step` of the
        # same records must give the same file, byte for byte, which repro verifies; uneven lists
        # are refused.
        from repro.writer import layout_of

        records = [
            Record("x", "input", "F32", [2], struct.pack("<2f", 1, 2)),
            Record("w", "weight", "F32", [4], None, phase="forward", data_hash=b"\2" * 32),
            Record("y", "op_output", "F32", [2], None, inputs=["x", "w"], node=0, data_hash=b"\3" * 32),
        ]
        paths = [os.path.join(self.dir, name) for name in ("records", "layouts")]
        by_records, by_layouts = (TraceWriter(p, {"workload": "same", "steps": 3}, capture="steps:1", inline_max_bytes=8)
                                  for p in paths)
        for step in range(3):
            full = [r if step != 1 else Record(r.name, r.kind, r.dtype, r.shape, bytes(4 * r.shape[0]), r.phase,
                                               r.inputs, r.node) for r in records]
            by_records.write_step(step, full)
            # Laid out by hand in LAYOUT_FIELDS' order, shapes as lists: compared, checked and
            # encoded as `layout_of` would make them.
            layouts = [(r.name, r.kind, r.dtype, list(r.shape), r.phase, tuple(r.inputs), r.node, r.source, None,
                        None, None) for r in full]
            by_layouts.write_laid_out(step, layouts, [r.data for r in full], [r.data_hash for r in full])
        with self.assertRaises(WriteError) as e:
            by_layouts.write_laid_out(3, [layout_of(records[0])], [records[0].data], [])
        self.assertIn("1 layouts, 1 values and 0 hashes", str(e.exception))
        self.assertEqual(by_records.finish(), by_layouts.finish())
        self.assertEqual(*(record_and_payload(p, 1) for p in paths))
        run = repro("inspect", paths[1], "--verify")
        self.assertEqual(run.returncode, 0, run.stdout + run.stderr)

    def test_steps_laid_out_alike_pack_as_msgpack_does_and_still_check_their_values(self):
        # A step laid out as the last one reuses its encoding and skips the checks of how its
        # records relate: every frame must still be exactly msgpack's packing of the record it
        # decodes to, and every value still checked.
        import msgpack

        path = os.path.join(self.dir, "alike")
        self.assertEqual(write_alike_steps(self, path), 4)
        _, frames = frames_of(os.path.join(path, "records.rpr"))
        steps = [msgpack.unpackb(frame, raw=False) for frame in frames[1:-1]]
        self.assertEqual([s["step"] for s in steps], [0, 1, 2, 3])
        for frame in frames:
            self.assertEqual(msgpack.packb(msgpack.unpackb(frame, raw=False), use_bin_type=True), frame)
        self.assertEqual(steps[2]["payload"], "tensors/step-00000002.safetensors")
        self.assertEqual([t["in_payload"] for t in steps[2]["tensors"]], [False, True, False, False, True, False])
        self.assertEqual((steps[1]["tensors"][5]["reduce_scatter"], steps[1]["tensors"][5]["inputs"]), ("sum", ["g.local"]))
        with Trace(path) as t:
            g = next(x for x in list(t.steps())[3].tensors if x.name == "g")
        self.assertEqual((g.reduce_scatter, g.shard.whole, g.collective), ("sum", [4], None))
        self.assertEqual(steps[3]["tensors"][0]["inline"], struct.pack("<2f", 3, 1))
        run = repro("inspect", path, "--verify")
        self.assertEqual(run.returncode, 0, run.stdout + run.stderr)

    def test_records_packed_by_the_native_library_are_byte_identical_to_python_s(self):
        # repro's native library (python/cuda-hash/src/records.rs) packs the steps that keep no
        # full values, the records given with their bytes packed in Python and passed whole; the
        # trace must be the Python writer's, byte for byte, and a bad value refused alike.
        from repro.writer import NativeRecords

        self.assertTrue(os.path.isfile(NATIVE_LIB), f"no native library at {NATIVE_LIB}: build it with "
                        "`cargo build --release -p repro-cuda-hash` (scripts/python-torch-check.sh does)")
        packed = []
        native = NativeRecords(NATIVE_LIB)
        pack = native.pack
        native.pack = lambda *args: packed.append(pack(*args)) or packed[-1]
        paths = [os.path.join(self.dir, name) for name in ("python", "native")]
        self.assertEqual(write_alike_steps(self, paths[0]), write_alike_steps(self, paths[1], native))
        self.assertEqual(len(packed), 3)  # steps 0, 1 and 3; step 2 keeps full values
        self.assertEqual(*(record_and_payload(p, 2) for p in paths))

    def test_bad_input_is_refused_before_anything_is_written(self):
        path = os.path.join(self.dir, "bad")
        w = TraceWriter(path, {"workload": "bad"}, capture="none", distributed=RANK_0_OF_2)
        for records, says in (
            ([Record("x", "input", "F32", [2], b"\0" * 4)], "4 bytes for F32 [2] (8 expected)"),
            ([Record("x", "input", "F32", [], b"\0" * 4), Record("x", "input", "F32", [], b"\0" * 4)], "twice"),
            ([Record("x\x1b[2J", "input", "U8", [], b"\0")], "control character"),
            ([Record("y", "op_output", "U8", [], b"\0", inputs=["nowhere"])], "not recorded earlier"),
            ([Record("z", "weights", "U8", [], b"\0")], "unknown kind"),
            ([Record("s", "weight", "U8", [2], b"\0\0", shard=([3], [2]))], "does not lie within the whole [3]"),
            ([Record("s", "weight", "U8", [2], b"\0\0", shard=([3, 1], [0]))], "does not lie within"),
            ([Record("l", "gradient", "U8", [3], b"\0" * 3),
              Record("s", "gradient", "U8", [2], b"\0\0", inputs=["l"], shard=([4], [2]), reduce_scatter="sum")],
             "with its dtype and the whole sum's shape"),
            ([Record("l", "gradient", "U8", [4], b"\0" * 4),
              Record("s", "gradient", "U8", [2], b"\0\0", inputs=["l"], reduce_scatter="sum")], "a shard"),
            ([Record("l", "gradient", "U8", [4], b"\0" * 4),
              Record("s", "gradient", "U8", [2], b"\0\0", inputs=["l"], shard=([4], [2]), reduce_scatter="max")],
             "is `sum`"),
        ):
            with self.assertRaises(WriteError) as e:
                w.write_step(0, records)
            self.assertIn(says, str(e.exception))
        # A trace of one device has no other rank to hold the rest of a tensor.
        alone = TraceWriter(os.path.join(self.dir, "alone"), {"workload": "bad"}, capture="none")
        with self.assertRaisesRegex(WriteError, "a trace of one device has no other rank"):
            alone.write_step(0, [Record("s", "weight", "U8", [2], b"\0\0", shard=([3], [1]))])
        alone.write_step(0, [Record("s", "weight", "U8", [3], b"\0\0\0", shard=([3], [0]))])
        alone.finish()
        w.write_step(3, [Record("x", "input", "U8", [], b"\1"), Record("s", "weight", "U8", [2], b"\0\0", shard=([3], [1]))])
        with self.assertRaises(WriteError):
            w.write_step(3, [])
        w.finish()
        self.assertEqual(repro("inspect", path).returncode, 0)
        with Trace(path) as t:
            shard = next(x for x in next(iter(t.steps())).tensors if x.name == "s").shard
        self.assertEqual((shard.whole, shard.offset), ([3], [1]))
        # A trace is never replaced silently, and a directory of other files never written into.
        with self.assertRaises(WriteError) as e:
            TraceWriter(path, {"workload": "again"})
        self.assertIn("already holds a trace", str(e.exception))
        TraceWriter(path, {"workload": "again"}, replace=True).finish()
        other = os.path.join(self.dir, "other")
        os.makedirs(other)
        open(os.path.join(other, "notes.txt"), "w").close()
        with self.assertRaises(WriteError):
            TraceWriter(other, {"workload": "x"})

    def test_every_run_setting_is_kept_as_text_and_one_a_header_cannot_keep_is_refused_by_name(self):
        path = os.path.join(self.dir, "settings")
        w = TraceWriter(path, {"workload": "settings", "steps": 1, "seed": 0, "lr": 1e-3, "bf16": False,
                               "shape": [32, 4], "adam": {"beta2": 0.999, "beta1": 0.9}, "note": None,
                               "params": {"batch": 32, "data": "a.bin"}})
        w.finish()
        self.assertEqual(repro("inspect", path, "--verify").returncode, 0)
        with Trace(path) as t:
            self.assertEqual(t.header["run"], {"workload": "settings", "steps": 1, "params": {
                "adam": '{"beta1":0.9,"beta2":0.999}', "batch": "32", "bf16": "false", "data": "a.bin",
                "lr": "0.001", "note": "null", "seed": "0", "shape": "[32,4]"}})
        for run, says in (({"workload": "w", "scale": lambda x: x}, "the run setting `scale` is function"),
                          ({"workload": "w", "params": {"opt": object()}}, "the run setting `opt` is object"),
                          ({"workload": "w", "seed": 1, "params": {"seed": 1}}, "the run setting `seed` is given twice"),
                          ({"workload": "w", "params": [("seed", 1)]}, "`params` is list, not a map")):
            with self.subTest(says=says):
                with self.assertRaisesRegex(WriteError, says):
                    TraceWriter(os.path.join(self.dir, "refused"), run)
                self.assertFalse(os.path.exists(os.path.join(self.dir, "refused")))


if __name__ == "__main__":
    unittest.main()


# The place of rank 0 of a run of two: a stream whose shards are half of their wholes.
RANK_0_OF_2 = {"rank": 0, "world_size": 2, "backend": "file", "backend_version": ""}


def write_alike_steps(test: unittest.TestCase, path: str, native=None) -> int:
    """Writes four steps of the same layout (inputs inline, a weight by its data hash, a node
    with a source, shards, a reduce-scatter; step 2 keeping full values), with two bad steps
    refused on the way; the steps written. `native`: `NativeRecords` packs them."""
    w = TraceWriter(path, {"workload": "alike", "steps": 4}, capture="steps:2", inline_max_bytes=8,
                    distributed=RANK_0_OF_2)
    if native is not None:
        w.use_native_records(native)

    def step(n, data_hash=b"\1" * 32, twice=False):
        records = [
            Record("x", "input", "F32", [2], struct.pack("<2f", n, 1)),
            Record("w", "weight", "F32", [4], None if n != 2 else bytes(16), phase="forward",
                   data_hash=None if n == 2 else data_hash),
            Record("y", "op_output", "F32", [2], struct.pack("<2f", n, 2), inputs=["x", "w"], node=0,
                   source="train.py:7"),
            Record("s", "weight", "U8", [2], bytes([n, n]), shard=([4], [2])),
            # This rank's whole share of a gradient, and its block of the ranks' sum (1.8).
            Record("g.local", "gradient", "F32", [4], struct.pack("<4f", n, 1, 2, 3)),
            Record("g", "gradient", "F32", [2], struct.pack("<2f", 2, 3), inputs=["g.local"], shard=([4], [2]),
                   reduce_scatter="sum"),
        ]
        return records + records[:1] if twice else records

    w.write_step(0, step(0))
    w.write_step(1, step(1))
    with test.assertRaises(WriteError) as e:
        w.write_step(2, step(2, twice=True))  # a new layout: checked as a whole again
    test.assertIn("twice", str(e.exception))
    with test.assertRaises(WriteError) as e:
        w.write_step(2, step(1, data_hash=b"\1" * 31))  # the same layout, a bad value
    test.assertIn("`w`: neither its bytes nor a 32-byte data hash", str(e.exception))
    w.write_step(2, step(2))  # full values, `w` in the payload
    w.write_step(3, step(3))
    return w.finish()


def record_and_payload(path: str, step: int) -> tuple[bytes, bytes]:
    """A trace's record file and step `step`'s payload file, as bytes."""
    with open(os.path.join(path, "records.rpr"), "rb") as f, \
            open(os.path.join(path, "tensors", f"step-{step:08d}.safetensors"), "rb") as g:
        return f.read(), g.read()

