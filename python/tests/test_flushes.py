"""When repro.torch flushes the module outputs it holds (`repro.torch.flushes`): the memory caps,
and the share of the outputs held that a flush measures the recorder alone kept alive. Skipped
where torch is not installed."""

import os
import shutil
import sys
import tempfile
import unittest
import weakref
from unittest import mock

try:
    import torch
except ImportError:  # pragma: no cover
    torch = None

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cpu_hash_library import hash_on_cpu_stand_in  # noqa: E402

MIB = 1 << 20

if torch is not None:
    from repro.torch.options import FlushOptions

    FLUSH = FlushOptions()  # the caps a recorder has by default


class Memory:
    """A stand-in for PyTorch's allocated bytes, now and at their peak, moved by hand."""

    def __init__(self, peak=1 << 40):
        self.in_use = 0
        self.peak = peak
        self.readings = 0

    def __call__(self, devices):
        self.readings += 1
        return self.in_use, self.peak


@unittest.skipUnless(torch, "torch is not installed")
class FlushPolicyTest(unittest.TestCase):
    def policy(self, memory):
        from repro.torch.flushes import FlushPolicy

        return FlushPolicy(memory_in_use=memory)

    def flush(self, policy, memory, shared, own, freed):
        """A flush measured by `policy`, letting go of `freed` bytes, `own` of them the recorder's."""
        measure = policy.measure(shared, [0])
        self.assertIsNotNone(measure)
        memory.in_use -= freed
        measure.done(own)

    def test_outputs_held_count_whole_until_a_flush_has_measured_that_the_program_keeps_them(self):
        memory = Memory()
        memory.in_use = 8 << 30
        policy = self.policy(memory)
        policy.step_started([0])
        self.assertTrue(policy.holds_too_much(FLUSH.max_queued_bytes, 0))
        self.assertFalse(policy.holds_too_much(FLUSH.max_queued_bytes - 1, 0))
        # The flush let go of the recorder's 10 MiB of copies only: the program kept its outputs.
        self.flush(policy, memory, shared=300 * MIB, own=10 * MIB, freed=10 * MIB)
        self.assertEqual(policy.unshared, 0.0)
        self.assertFalse(policy.holds_too_much(FLUSH.max_held_bytes - 1, 0))
        # Outputs held are capped whatever the measure says; the recorder's own copies count whole.
        self.assertTrue(policy.holds_too_much(FLUSH.max_held_bytes, 0))
        self.assertTrue(policy.holds_too_much(0, FLUSH.max_queued_bytes))

    def test_the_share_counted_is_the_last_measuring_steps_largest_or_this_steps_when_larger(self):
        memory = Memory()
        memory.in_use = 8 << 30
        policy = self.policy(memory)
        self.flush(policy, memory, shared=400 * MIB, own=0, freed=200 * MIB)
        self.flush(policy, memory, shared=400 * MIB, own=0, freed=40 * MIB)
        self.assertEqual(policy.unshared, 0.5)  # the step's largest, from when it was measured
        policy.step_ended()
        self.assertEqual(policy.unshared, 0.5)
        self.flush(policy, memory, shared=400 * MIB, own=0, freed=80 * MIB)
        self.assertEqual(policy.unshared, 0.5)  # the last step's is larger
        self.flush(policy, memory, shared=400 * MIB, own=0, freed=360 * MIB)
        self.assertEqual(policy.unshared, 0.9)  # this step's, at once
        policy.step_ended()
        self.flush(policy, memory, shared=400 * MIB, own=0, freed=0)
        policy.step_ended()
        self.assertEqual(policy.unshared, 0.0)
        policy.step_ended()  # a step that measured nothing changes nothing
        self.assertEqual(policy.unshared, 0.0)
        # A reading that moved the wrong way (memory the flush did not free) counts as nothing
        # freed; more freed than held counts as all of it.
        self.flush(policy, memory, shared=400 * MIB, own=0, freed=-20 * MIB)
        self.assertEqual(policy.unshared, 0.0)
        self.flush(policy, memory, shared=400 * MIB, own=0, freed=1200 * MIB)
        self.assertEqual(policy.unshared, 1.0)

    def test_the_memory_kept_is_capped_at_a_share_of_the_programs_peak(self):
        memory = Memory(peak=2 << 30)
        policy = self.policy(memory)
        self.assertEqual(policy.extra_cap, FLUSH.max_queued_bytes)  # until a step has read the peak
        policy.step_started([0])
        cap = int(FLUSH.extra_share * (2 << 30))
        self.assertLess(cap, FLUSH.max_queued_bytes)
        self.assertEqual(policy.extra_cap, cap)
        self.assertTrue(policy.holds_too_much(0, cap))  # the recorder's copies
        self.assertFalse(policy.holds_too_much(0, cap - 1))
        self.assertTrue(policy.holds_too_much(cap, 0))  # outputs, counted whole until measured
        # A flush of fewer outputs than the cap measures nothing: it is under it anyway.
        self.assertIsNone(policy.measure(cap - 1, [0]))
        self.assertIsNotNone(policy.measure(cap, [0]))
        memory.peak = 1 << 20
        policy.step_started([0])
        self.assertEqual(policy.extra_cap, FLUSH.extra_min_bytes)
        memory.peak = 1 << 50
        policy.step_started([0])
        self.assertEqual(policy.extra_cap, FLUSH.max_queued_bytes)
        policy.step_started([])  # no GPU hashed on yet: nothing read, nothing changed
        self.assertEqual(policy.extra_cap, FLUSH.max_queued_bytes)

    def test_nothing_is_measured_below_the_cap_or_without_a_reading(self):
        memory = Memory()
        policy = self.policy(memory)
        self.assertIsNone(policy.measure(FLUSH.max_queued_bytes - 1, [0]))
        self.assertIsNone(policy.measure(1 << 30, []))
        self.assertEqual(memory.readings, 0)
        self.assertIsNone(self.policy(lambda devices: None).measure(1 << 30, [0]))

    @unittest.skipIf(torch and torch.cuda.is_available(), "reads a GPU's memory where there is one")
    def test_without_cuda_the_memory_in_use_cannot_be_read_and_outputs_count_whole(self):
        from repro.torch.flushes import cuda_memory_in_use

        self.assertIsNone(cuda_memory_in_use([0]))
        policy = self.policy(None)
        self.assertIsNone(policy.measure(1 << 30, [0]))
        self.assertTrue(policy.holds_too_much(FLUSH.max_queued_bytes, 0))


class Chain(torch.nn.Module if torch else object):
    """Linear layers one after another; `keep`: the forward pass keeps every output (as autograd
    keeps a training step's), else each is dropped once the next is computed."""

    def __init__(self, width=256, depth=24):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(width, width) for _ in range(depth))
        self.keep, self.kept = False, []
        self.in_place = False  # each output changed in place after its hook (copied under blake3)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
            if self.in_place:
                x.relu_()
            if self.keep:
                self.kept.append(x)
        return x


@unittest.skipUnless(torch, "torch is not installed")
class OutputsHeldTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="repro-flushes-")

    def tearDown(self):
        shutil.rmtree(self.dir)

    def record(self, name, keep, stand_in=True, steps=6, in_place=False):
        """Records `Chain`'s forward passes (64 KiB an output) with caps of 128 KiB and 512 KiB;
        PyTorch's memory in use read as the bytes of the outputs still alive. Returns the
        stand-in library (None on the host) and the records' bytes."""
        from repro.torch import ModelRecorder, Recorder

        torch.manual_seed(0)
        model = Chain()
        model.keep, model.in_place = keep, in_place
        alive = []
        for layer in model.layers:
            layer.register_forward_hook(lambda m, args, out: alive.append(weakref.ref(out)))

        def memory_in_use(devices):
            """The outputs alive and the tensors the hasher holds (the recorder's copies among
            them), once each; a peak that puts the cap at FLUSH.max_queued_bytes."""
            tensors = [t for t in (r() for r in alive) if t is not None]
            tensors += [t for t in recorder.hashers[0]._held if isinstance(t, torch.Tensor)]
            return sum({t.data_ptr(): t.nbytes for t in tensors}.values()), 1 << 50

        path = os.path.join(self.dir, name)
        caps = FlushOptions(mode="batched", max_queued_bytes=128 << 10, max_held_bytes=512 << 10)
        recorder = Recorder(path, {"workload": "chain", "steps": steps}, capture="none", modules="all", flush=caps)
        recorder.flush_policy.memory_in_use = memory_in_use
        library = hash_on_cpu_stand_in(recorder) if stand_in else None
        rec = ModelRecorder(recorder, model)
        g = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for step in range(steps):
                model.kept = []
                x = torch.randn(64, 256, generator=g)
                with rec.forward_pass(step, inputs={"x": x}) as s:
                    s.output("logits", model(x))
        rec.finish()
        with open(os.path.join(path, "records.rpr"), "rb") as f:
            return library, recorder.flush_policy, f.read()

    def test_outputs_the_program_keeps_are_flushed_together_and_those_it_drops_at_the_cap_hashed_alike(self):
        for keep in (True, False):
            _, _, expected = self.record(f"host-{keep}", keep, stand_in=False)
            library, policy, records = self.record(f"stand-in-{keep}", keep)
            self.assertEqual(records, expected, f"keep={keep}: a hash is not the host's")
            if keep:
                kept_flushes, kept_share = library.flushes, policy.unshared
            else:
                dropped_flushes, dropped_share = library.flushes, policy.unshared
        self.assertEqual(kept_share, 0.0)
        # Dropped: the outputs held but the last two (the program's still, at the hook that
        # flushes: its input and output) were the recorder's alone.
        self.assertGreater(dropped_share, 0.3)
        # Kept: a flush every eight outputs (the 512 KiB cap on outputs held) once the second
        # step has measured them; dropped: every three to six, as measured.
        self.assertGreaterEqual(dropped_flushes - kept_flushes, 2 * 5)

    def test_the_recorders_copies_count_as_its_own_and_the_programs_outputs_as_shared(self):
        # Changed in place after their hooks, the outputs are copied there under blake3: the
        # copies are the recorder's own, which a flush's measure subtracts from what it freed.
        from repro.torch.recorder import StepRecorder

        held = []
        flush_outputs = StepRecorder._flush_outputs

        def counted(step):
            held.append((step.step, step._shared_queued, step._own_queued))
            flush_outputs(step)

        for in_place in (True, False):
            held.clear()
            _, _, expected = self.record(f"host-{in_place}", keep=True, stand_in=False, in_place=in_place)
            with mock.patch.object(StepRecorder, "_flush_outputs", counted):
                _, _, records = self.record(f"stand-in-{in_place}", keep=True, in_place=in_place)
            self.assertEqual(records, expected, f"in_place={in_place}: a hash is not the host's")
            after_first = [(shared, own) for step, shared, own in held if step > 0 and shared + own]
            self.assertTrue(after_first)
            if in_place:
                self.assertTrue(all(shared == 0 and own > 0 for shared, own in after_first), after_first)
            else:
                self.assertTrue(all(shared > 0 and own == 0 for shared, own in after_first), after_first)
