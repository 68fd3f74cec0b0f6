"""The data hash `xxh3-1k` (docs/trace-format.md, section 5.5) in the Python writer and reader: a
trace of it is written as format 2.1 with the header's `data_hash`, its hashes are the
specification's and its values are checked against them; a `blake3` trace is written as a 1.x
one (1.9, no key); a 1.x trace with the key, an unknown data hash and traces of two data hashes
compared by hash are refused; xxhash is needed only for `xxh3-1k`. The last test needs REPRO_BIN
(a built repro) that reads format 2.1."""

import io
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import unittest
from contextlib import redirect_stderr, redirect_stdout
from unittest import mock

import msgpack
import numpy as np

import repro.trace as repro_trace
from repro.trace import Corrupt, HashMismatch, Trace, Unsupported, read_tensor
from repro.writer import Record, TraceWriter, WriteError

# The specification's own Python beside this file, however the tests are run.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from record_file import frames_of, rewrite_header, write_frames  # noqa: E402
from spec_hash import data_hash_xxh3_1k, tensor_hash  # noqa: E402

REPRO = os.environ.get("REPRO_BIN", "target/release/repro")

# Element byte counts around the chunk's 1024 bytes: none, inline, short of a chunk, one, just
# past one, several with a tail, and many.
SIZES = {"empty": 0, "inline": 8, "short": 1020, "one": 1024, "past": 1028, "tail": 3 * 1024 + 12,
         "many": 64 * 1024 + 4}


class DataHashTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="repro-data-hash-")
        rng = np.random.default_rng(5)
        self.data = {name: rng.bytes(size) for name, size in SIZES.items()}

    def tearDown(self):
        shutil.rmtree(self.dir)

    def write(self, name: str, data_hash=None, capture="all", hashes_only=False) -> str:
        """A trace of two steps of `self.data` as U8 tensors (the second step's values reversed),
        written with `data_hash` (the writer's default when None); `hashes_only`: each record not
        stored inline given by its data hash as the specification computes it, not its bytes."""
        path = os.path.join(self.dir, name)
        options = {} if data_hash is None else {"data_hash": data_hash}
        w = TraceWriter(path, {"workload": "chunks", "steps": 2}, capture=capture, inline_max_bytes=16, **options)
        for step in range(2):
            records = []
            for tensor, data in self.data.items():
                data = data[::-1] if step else data
                if hashes_only and len(data) > 16:
                    records.append(Record(tensor, "weight", "U8", [len(data)], None, data_hash=data_hash_xxh3_1k(data)))
                else:
                    records.append(Record(tensor, "weight", "U8", [len(data)], data))
            w.write_step(step, records)
        w.finish()
        return path

    def test_an_xxh3_1k_trace_is_written_as_2_1_and_hashes_as_the_specification_says(self):
        path = self.write("xxh3", "xxh3-1k")
        preamble, frames = frames_of(os.path.join(path, "records.rpr"))
        self.assertEqual(preamble[8:], struct.pack("<HH", 2, 1))
        header = msgpack.unpackb(frames[0], raw=False)
        self.assertEqual(header["format"], {"major": 2, "minor": 1})
        self.assertEqual(list(header)[-1], "data_hash")  # after `capture`, in the documented order
        self.assertEqual(header["data_hash"], "xxh3-1k")
        with Trace(path) as t:
            self.assertEqual((t.version, t.data_hash), ((2, 1), "xxh3-1k"))
            steps = list(t.steps())
            for s in steps:
                for x in s.tensors:
                    data = self.data[x.name][::-1] if s.step else self.data[x.name]
                    self.assertEqual(x.hash, tensor_hash("U8", [len(data)], data, "xxh3-1k"), x.name)
                    self.assertEqual(t.values(s, x), data, x.name)  # checked against the hash
            self.assertTrue(t.complete)
        # Not BLAKE3's hash of the bytes (but an empty tensor's: no leaves, BLAKE3 of nothing).
        blake3_hashes = {n: tensor_hash("U8", [len(d)], d) for n, d in self.data.items()}
        self.assertEqual([x.name for x in steps[0].tensors if x.hash == blake3_hashes[x.name]], ["empty"])
        self.assertTrue(np.array_equal(read_tensor(path, 1, "tail"), np.frombuffer(self.data["tail"][::-1], np.uint8)))
        out = io.StringIO()
        with redirect_stdout(out):
            self.assertEqual(repro_trace.main(["verify", path]), 0)
        self.assertIn("format 2.1 (data hash xxh3-1k)", out.getvalue())
        self.assertIn(f"{2 * len(SIZES)} stored values match", out.getvalue())
        # A data hash computed elsewhere (a GPU's, say) writes the record the bytes write.
        by_hash = self.write("by-hash", "xxh3-1k", capture="none", hashes_only=True)
        by_bytes = self.write("by-bytes", "xxh3-1k", capture="none")
        with open(os.path.join(by_hash, "records.rpr"), "rb") as a, \
                open(os.path.join(by_bytes, "records.rpr"), "rb") as b:
            self.assertEqual(a.read(), b.read())

    def test_a_damaged_value_of_an_xxh3_1k_trace_is_caught_by_its_hash(self):
        for where in ("payload", "inline"):
            path = self.write(f"damaged-{where}", "xxh3-1k")
            if where == "payload":
                damaged = os.path.join(path, "tensors", "step-00000001.safetensors")
                with open(damaged, "rb") as f:
                    raw = bytearray(f.read())
                length = struct.unpack_from("<Q", raw)[0]
                name = "many"
                end = 8 + length + json.loads(raw[8:8 + length])[name]["data_offsets"][1]
                raw[end - 2] ^= 0x01  # in its last chunk's 4 bytes, before the padding
                with open(damaged, "wb") as f:
                    f.write(raw)
            else:
                damaged = os.path.join(path, "records.rpr")
                preamble, frames = frames_of(damaged)
                step = msgpack.unpackb(frames[2], raw=False)
                inline = step["tensors"][1]["inline"]
                step["tensors"][1]["inline"] = bytes([inline[0] ^ 0x80]) + inline[1:]
                frames[2] = msgpack.packb(step, use_bin_type=True)
                write_frames(damaged, preamble, frames)
                name = "inline"
            with Trace(path) as t:
                s = list(t.steps())[1]
                with self.assertRaises(HashMismatch) as e:
                    t.values(s, next(x for x in s.tensors if x.name == name))
            self.assertIn(damaged, str(e.exception))
            self.assertIn(f"step 1, tensor `{name}`", str(e.exception))
            with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()):
                self.assertEqual(repro_trace.main(["verify", path]), 1)

    def test_a_blake3_trace_is_written_as_1_10_without_the_key(self):
        default, named = self.write("default"), self.write("named", "blake3")
        for path in (default, named):
            preamble, frames = frames_of(os.path.join(path, "records.rpr"))
            self.assertEqual(preamble[8:], struct.pack("<HH", 1, 10))
            header = msgpack.unpackb(frames[0], raw=False)
            self.assertEqual(header["format"], {"major": 1, "minor": 10})
            self.assertNotIn("data_hash", header)
            with Trace(path) as t:
                self.assertEqual(t.data_hash, "blake3")
                s = next(iter(t.steps()))
                self.assertEqual([x.hash for x in s.tensors],
                                 [tensor_hash("U8", [len(d)], d) for d in self.data.values()])
        with open(os.path.join(default, "records.rpr"), "rb") as a, open(os.path.join(named, "records.rpr"), "rb") as b:
            self.assertEqual(a.read(), b.read())

    def test_an_unknown_data_hash_is_refused_before_anything_is_written(self):
        path = os.path.join(self.dir, "unknown")
        with self.assertRaises(WriteError) as e:
            TraceWriter(path, {"workload": "x"}, data_hash="xxh3")
        self.assertIn("data hash 'xxh3' is not one of blake3, xxh3-1k", str(e.exception))
        self.assertFalse(os.path.exists(path))

    def test_a_data_hash_in_a_1_x_trace_or_of_an_unknown_kind_is_corrupt(self):
        path = self.write("header", "xxh3-1k")
        records = os.path.join(path, "records.rpr")
        preamble, frames = frames_of(records)

        def with_header(version, data_hash):
            rewrite_header(records, preamble, frames, version, lambda header: header.update(data_hash=data_hash))

        for version, data_hash, refused, says in (
            ((1, 8), "xxh3-1k", Corrupt, "`data_hash` other than blake3 is a key of format 2.0, but the file declares 1.8"),
            ((2, 0), "xxh3-2k", Corrupt, "header `data_hash` 'xxh3-2k' is not one of blake3, xxh3-1k"),
            ((2, 0), 1, Corrupt, "must be a string"),
            ((3, 0), "xxh3-1k", Unsupported, "reads only 1.x and 2.x"),
        ):
            with_header(version, data_hash)
            with self.assertRaises(refused) as e:
                Trace(path).close()
            self.assertIn(says, str(e.exception))
            self.assertIn(records, str(e.exception))
        # A 1.x trace may name the default (the only data hash it has): its hashes are then
        # BLAKE3's, and these, xxh3-1k's, do not match.
        with_header((1, 8), "blake3")
        with Trace(path) as t:
            self.assertEqual(t.data_hash, "blake3")
        # A 2.0 trace may name the default too.
        with_header((2, 0), "blake3")
        with Trace(path) as t:
            self.assertEqual(t.data_hash, "blake3")
            s = next(iter(t.steps()))
            with self.assertRaises(HashMismatch):
                t.values(s, s.tensors[-1])

    def test_traces_of_different_data_hashes_are_not_compared_by_hash(self):
        blake, xxh3 = self.write("blake3"), self.write("xxh3", "xxh3-1k")
        err = io.StringIO()
        with redirect_stdout(io.StringIO()) as out, redirect_stderr(err):
            self.assertEqual(repro_trace.main(["diff", blake, xxh3]), 2)
        self.assertEqual(out.getvalue(), "")
        self.assertIn(f"{blake} hashes tensors with the data hash blake3, {xxh3} with xxh3-1k", err.getvalue())
        with redirect_stdout(io.StringIO()) as out:
            self.assertEqual(repro_trace.main(["diff", xxh3, self.write("again", "xxh3-1k")]), 0)
        self.assertIn("IDENTICAL: 2 steps", out.getvalue())

    def test_blake3_traces_need_no_xxhash_and_xxh3_1k_ones_say_to_install_it(self):
        xxh3 = self.write("xxh3", "xxh3-1k")
        empty = tensor_hash("U8", [0], b"", "xxh3-1k")
        with mock.patch.dict(sys.modules, {"xxhash": None}):  # imports of xxhash fail
            with self.assertRaises(WriteError) as e:
                TraceWriter(os.path.join(self.dir, "refused"), {"workload": "x"}, data_hash="xxh3-1k")
            self.assertIn("pip install xxhash", str(e.exception))
            self.assertFalse(os.path.exists(os.path.join(self.dir, "refused")))
            blake = self.write("blake3")
            with Trace(blake) as t:
                s = next(iter(t.steps()))
                self.assertEqual([t.values(s, x) for x in s.tensors], list(self.data.values()))
            with Trace(xxh3) as t:  # its hashes read, its values not checked
                s = next(iter(t.steps()))
                self.assertEqual(s.tensors[0].hash, empty)
                with self.assertRaises(ImportError) as e:
                    t.values(s, s.tensors[1])
                self.assertIn("the data hash xxh3-1k needs the xxhash package: pip install xxhash", str(e.exception))
            err = io.StringIO()
            with redirect_stdout(io.StringIO()), redirect_stderr(err):
                self.assertEqual(repro_trace.main(["verify", xxh3]), 2)
            self.assertIn("pip install xxhash", err.getvalue())

    def test_repro_verifies_a_python_written_xxh3_1k_trace(self):
        # The Rust reader recomputes every hash of the trace the Python writer wrote with the
        # data hash xxh3-1k, and refuses the same trace declared 1.8.
        path = self.write("xxh3", "xxh3-1k")
        run = subprocess.run([REPRO, "inspect", path, "--verify"], capture_output=True, text=True)
        self.assertEqual(run.returncode, 0, run.stdout + run.stderr)
        self.assertIn("format     2.1", run.stdout)
        records = os.path.join(path, "records.rpr")
        rewrite_header(records, *frames_of(records), (1, 8))
        run = subprocess.run([REPRO, "inspect", path, "--verify"], capture_output=True, text=True)
        self.assertEqual(run.returncode, 2, run.stdout + run.stderr)
        self.assertIn("data_hash", run.stderr)


if __name__ == "__main__":
    unittest.main()
