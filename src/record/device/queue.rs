//! A device batch's queue, apart from CUDA: the reads queued, planned and flushed, the ticket
//! of each one's result, and a flush's results put back in ticket order. It is generic over
//! what a read is (`R`: a tensor or foreign memory, on the GPU) and what a flush leaves behind
//! (`F`: its buffers), so this bookkeeping is tested with no GPU; `batch` runs the reads.

use super::plan::{Plan, Slot, Want};
use crate::record::payload_stream::Kept;
use std::ops::Range;

/// What a queued read resolves to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolved {
    /// The tensor's canonical bytes.
    Bytes(Vec<u8>),
    /// BLAKE3 of the tensor's canonical bytes, computed on the device.
    DataHash([u8; 32]),
    /// The tensor's canonical bytes went to the batch's payload stream, at these bytes of the
    /// payload file's data.
    InFile(Range<u64>),
}

/// A flush, launched: the results it holds.
pub trait Launched {
    fn results(&self) -> usize;
}

/// A plan for some of the queue's reads, made on the host, with the reads whose addresses it
/// holds (alive until its kernels are queued).
pub struct Planned<R> {
    pub plan: Plan,
    pub reads: Vec<(R, Want)>,
}

/// The reads of one batch, by stage: queued since the last plan, planned and not launched yet
/// (in order), and flushed. Tickets number the results in the order the reads were queued,
/// across the stages.
pub struct Queue<R, F> {
    pending: Vec<(R, Want)>,
    planned: Vec<Planned<R>>,
    flushed: Vec<F>,
}

impl<R, F: Launched> Default for Queue<R, F> {
    fn default() -> Self {
        Queue { pending: Vec::new(), planned: Vec::new(), flushed: Vec::new() }
    }
}

impl<R, F: Launched> Queue<R, F> {
    /// Queues a read; the ticket of its result.
    pub fn push(&mut self, read: R, want: Want) -> usize {
        let ticket = self.tickets();
        self.pending.push((read, want));
        ticket
    }

    /// Tickets handed out so far: results flushed, planned and queued.
    pub fn tickets(&self) -> usize {
        self.flushed_results() + self.planned.iter().map(|p| p.plan.slots.len()).sum::<usize>() + self.pending.len()
    }

    /// Results of the flushes so far.
    pub fn flushed_results(&self) -> usize {
        self.flushed.iter().map(Launched::results).sum()
    }

    /// The reads queued since the last plan.
    pub fn pending(&self) -> &[(R, Want)] {
        &self.pending
    }

    /// Takes the reads queued since the last plan.
    pub fn take_pending(&mut self) -> Vec<(R, Want)> {
        std::mem::take(&mut self.pending)
    }

    /// Takes everything planned and not launched, and everything queued since, in ticket order:
    /// to plan again as one, so that the lot launches in one flush.
    pub fn take_unlaunched(&mut self) -> Vec<(R, Want)> {
        let mut reads: Vec<(R, Want)> = std::mem::take(&mut self.planned).into_iter().flat_map(|p| p.reads).collect();
        reads.append(&mut self.pending);
        reads
    }

    /// Adds a plan for reads taken from the queue (`take_pending`, `take_unlaunched`), after the
    /// plans already there. Its reads must be the next tickets' and nothing else.
    pub fn add_plan(&mut self, plan: Plan, reads: Vec<(R, Want)>) {
        debug_assert_eq!(plan.slots.len(), reads.len(), "a plan has one slot per read");
        self.planned.push(Planned { plan, reads });
    }

    /// Takes the plans not launched yet, in order (to launch them and `add_flushed` each).
    pub fn take_planned(&mut self) -> Vec<Planned<R>> {
        std::mem::take(&mut self.planned)
    }

    /// Adds a launched plan's flush, after those already there.
    pub fn add_flushed(&mut self, flushed: F) {
        self.flushed.push(flushed);
    }

    /// The flushes so far, in order.
    pub fn flushed(&self) -> &[F] {
        &self.flushed
    }

    /// Takes the flushes so far, in order.
    pub fn take_flushed(&mut self) -> Vec<F> {
        std::mem::take(&mut self.flushed)
    }

    /// Takes over `other`'s flushes, which must be all it holds, after this queue's own and
    /// before what it has planned or queued; their tickets here (the tickets of this queue's
    /// planned and queued reads move up by as many).
    pub fn absorb(&mut self, mut other: Queue<R, F>) -> Range<usize> {
        debug_assert!(other.pending.is_empty() && other.planned.is_empty(), "absorb a flushed queue");
        let (first, added) = (self.flushed_results(), other.flushed_results());
        self.flushed.append(&mut other.flushed);
        first..first + added
    }
}

/// One flush's results in ticket order: its hashes and gathered bytes from the host copy of its
/// output (`host`, laid out as `slots` say), the values read straight from their tensors from
/// `direct`, which holds one for each `Slot::Direct`, by slot index, in slot order.
pub fn in_ticket_order(slots: &[Slot], host: &[u8], direct: Vec<(usize, Kept)>) -> Vec<Resolved> {
    let mut direct = direct.into_iter();
    slots
        .iter()
        .enumerate()
        .map(|(i, slot)| match slot {
            Slot::Hash(r) => Resolved::DataHash(host[r.clone()].try_into().expect("32 bytes")),
            Slot::Bytes(r) => Resolved::Bytes(host[r.clone()].to_vec()),
            Slot::Direct => {
                let (at, kept) = direct.next().expect("a value for every direct slot");
                assert_eq!(at, i, "the values read straight from their tensors, in slot order");
                match kept {
                    Kept::Bytes(bytes) => Resolved::Bytes(bytes),
                    Kept::InFile(data) => Resolved::InFile(data),
                }
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::plan::View;
    use super::*;

    /// A flush holding as many results as it says.
    struct Flush(usize);

    impl Launched for Flush {
        fn results(&self) -> usize {
            self.0
        }
    }

    /// A plan over `n` views of `memory`, hashed.
    fn plan_of(memory: &[u8], n: usize) -> Plan {
        let dims = [memory.len()];
        let view = View { address: memory.as_ptr() as u64, elem_size: 1, dims: &dims, strides: &[1] };
        Plan::new(&vec![(view, Want::Hash); n]).expect("a flat view fits")
    }

    #[test]
    fn tickets_number_results_in_the_order_queued_across_the_stages() {
        let memory = [7u8; 64];
        let mut queue: Queue<&str, Flush> = Queue::default();
        assert_eq!((queue.push("a", Want::Hash), queue.push("b", Want::Bytes)), (0, 1));
        // Planned, then more queued: the plan and the queue count alike.
        let reads = queue.take_pending();
        queue.add_plan(plan_of(&memory, reads.len()), reads);
        assert_eq!(queue.push("c", Want::Hash), 2);
        assert_eq!(queue.pending().len(), 1);
        // Planning again takes the earlier plan's reads and the new ones, in ticket order.
        let reads = queue.take_unlaunched();
        assert_eq!(reads.iter().map(|(r, _)| *r).collect::<Vec<_>>(), ["a", "b", "c"]);
        assert_eq!(reads.iter().map(|(_, w)| *w).collect::<Vec<_>>(), [Want::Hash, Want::Bytes, Want::Hash]);
        assert_eq!(queue.tickets(), 0, "taken, nothing is counted twice");
        queue.add_plan(plan_of(&memory, reads.len()), reads);
        assert_eq!(queue.tickets(), 3);
        // Launched: the flush holds the results, and the next read comes after them.
        for planned in queue.take_planned() {
            queue.add_flushed(Flush(planned.reads.len()));
        }
        assert_eq!((queue.flushed_results(), queue.push("d", Want::Hash)), (3, 3));
        assert_eq!(queue.take_flushed().len(), 1);
    }

    #[test]
    fn an_absorbed_queue_s_results_come_after_the_flushed_and_before_the_queued() {
        let mut queue: Queue<&str, Flush> = Queue::default();
        queue.add_flushed(Flush(2));
        assert_eq!(queue.push("queued", Want::Hash), 2);
        let mut other: Queue<&str, Flush> = Queue::default();
        other.add_flushed(Flush(3));
        other.add_flushed(Flush(1));
        assert_eq!(queue.absorb(other), 2..6);
        assert_eq!(queue.flushed().iter().map(|f| f.0).collect::<Vec<_>>(), [2, 3, 1]);
        // The read queued before moves up behind them.
        assert_eq!(queue.tickets(), 7);
        assert_eq!(queue.push("next", Want::Hash), 7);
    }

    #[test]
    fn a_flush_s_results_come_back_in_ticket_order_whatever_their_slot() {
        let host: Vec<u8> = (0..48).collect();
        let slots = [Slot::Bytes(32..40), Slot::Direct, Slot::Hash(0..32), Slot::Direct, Slot::Bytes(40..48)];
        let direct = vec![(1, Kept::Bytes(vec![9; 5])), (3, Kept::InFile(100..150))];
        let hash: [u8; 32] = host[..32].try_into().unwrap();
        assert_eq!(
            in_ticket_order(&slots, &host, direct),
            [
                Resolved::Bytes(host[32..40].to_vec()),
                Resolved::Bytes(vec![9; 5]),
                Resolved::DataHash(hash),
                Resolved::InFile(100..150),
                Resolved::Bytes(host[40..48].to_vec()),
            ]
        );
    }

    #[test]
    #[should_panic(expected = "in slot order")]
    fn a_value_read_for_another_slot_is_a_bug_not_a_wrong_result() {
        in_ticket_order(&[Slot::Direct, Slot::Direct], &[], vec![(1, Kept::Bytes(vec![])), (0, Kept::Bytes(vec![]))]);
    }
}
