//! Tensors sharded across the ranks of a run (format 1.7 `shard`, an FSDP parameter and its
//! gradient): whether each step's shards tile their wholes, and whole tensors assembled from
//! the shards, so that runs which shard differently (other world sizes, FSDP against DDP or one
//! device) are compared on whole parameters where their values were stored.

use repro_trace::dtype::DType;
use repro_trace::shard::{place, tiling_gap, Block};
use repro_trace::{StepRecord, TensorKind, TensorRecord, TraceError, TraceReader};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// Where one sharded tensor's blocks sit at a step: its name, dtype, whole shape and every
/// rank's block, in rank order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ShardedTensor {
    pub name: String,
    pub dtype: DType,
    pub whole: Vec<u64>,
    pub blocks: Vec<Block>,
}

/// Why a step's shards do not make whole tensors: the tensor and the reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TilingGap {
    pub tensor: String,
    pub kind: TensorKind,
    pub reason: String,
}

/// The sharded tensors of one step, read from every rank's record of it (rank order), each
/// checked to tile its whole: each name that any rank records as a shard must be a shard on
/// every rank, of one whole shape and dtype, and the blocks must cover each element exactly once.
pub(crate) fn sharded_tensors(steps: &[&StepRecord]) -> Vec<Result<ShardedTensor, TilingGap>> {
    let by_name: Vec<BTreeMap<&str, &TensorRecord>> =
        steps.iter().map(|s| s.tensors.iter().map(|t| (t.name.as_str(), t)).collect()).collect();
    // Every sharded name, in the order of the first rank that records it as a shard.
    let mut names: Vec<&TensorRecord> = Vec::new();
    for step in steps {
        for t in step.tensors.iter().filter(|t| t.shard.is_some()) {
            if !names.iter().any(|n| n.name == t.name) {
                names.push(t);
            }
        }
    }
    names.into_iter().map(|first| sharded_tensor(&by_name, first)).collect()
}

/// The tensor `first` (a shard of it) names, from every rank's records (`by_name`, rank order).
fn sharded_tensor(by_name: &[BTreeMap<&str, &TensorRecord>], first: &TensorRecord) -> Result<ShardedTensor, TilingGap> {
    let gap = |reason: String| TilingGap { tensor: first.name.clone(), kind: first.kind, reason };
    let shard = first.shard.as_ref().expect("a sharded record");
    let mut blocks = Vec::with_capacity(by_name.len());
    for (rank, records) in by_name.iter().enumerate() {
        let Some(t) = records.get(first.name.as_str()) else {
            return Err(gap(format!("rank {rank} records no shard of it")));
        };
        let Some(theirs) = &t.shard else {
            return Err(gap(format!("rank {rank} records it whole, the others as shards")));
        };
        if theirs.whole != shard.whole || t.dtype != first.dtype {
            return Err(gap(format!(
                "rank {rank}'s shard is of a {} {:?} whole, another rank's of a {} {:?} one",
                t.dtype, theirs.whole, first.dtype, shard.whole
            )));
        }
        blocks.push(Block { rank: rank as u64, offset: theirs.offset.clone(), shape: t.shape.clone() });
    }
    if let Some(reason) = tiling_gap(&shard.whole, &blocks) {
        return Err(gap(format!("its shards do not tile it: {reason}")));
    }
    Ok(ShardedTensor { name: first.name.clone(), dtype: first.dtype, whole: shard.whole.clone(), blocks })
}

/// A step's shards as a comparable key: each sharded record's name, whole, offset and shape,
/// sorted.
pub(crate) type Layout = Vec<(String, Vec<u64>, Vec<u64>, Vec<u64>)>;

/// The layout of one rank's shards at a step.
pub(crate) fn layout_of(step: &StepRecord) -> Layout {
    let mut layout: Vec<_> = step
        .tensors
        .iter()
        .filter_map(|t| t.shard.as_ref().map(|s| (t.name.clone(), s.whole.clone(), s.offset.clone(), t.shape.clone())))
        .collect();
    layout.sort();
    layout
}

/// Replaces, step by step, rank 0's shards by whole tensors assembled from every rank's shard.
/// A whole whose shards are not all stored with their values (hash-only steps), or do not tile
/// it, stays a shard, which the comparison leaves out and counts: a whole's hash cannot be
/// derived from its shards' hashes.
pub(crate) struct Assembler {
    /// Ranks 1 and up, read in step with rank 0.
    others: Vec<TraceReader>,
    /// The last step read from each of them, kept until rank 0 reaches it.
    pending: Vec<Option<StepRecord>>,
    /// Whole tensors assembled and so compared.
    pub assembled: u64,
    /// Sharded tensors left out of the comparison this assembler served (set by it).
    pub left_out: u64,
}

impl Assembler {
    /// For a run whose rank streams are `streams` (rank 0 first; one for a single device).
    pub fn open(streams: &[PathBuf]) -> Result<Self, TraceError> {
        let others = streams[1..].iter().map(TraceReader::open).collect::<Result<Vec<_>, _>>()?;
        let pending = vec![None; others.len()];
        Ok(Assembler { others, pending, assembled: 0, left_out: 0 })
    }

    /// `step` (read from `rank0`) with each sharded record replaced by its whole.
    pub fn assemble(&mut self, rank0: &mut TraceReader, mut step: StepRecord) -> Result<StepRecord, TraceError> {
        if !step.tensors.iter().any(|t| t.shard.is_some()) {
            return Ok(step);
        }
        for other in &self.others {
            rank0.comparable_with(other)?;
        }
        if self.others.is_empty() {
            // One stream: each shard is its whole, or the run lacks the rest of it.
            step.tensors = std::mem::take(&mut step.tensors).into_iter().map(whole_already).collect();
            return Ok(step);
        }
        // The other ranks' records of this step (a rank that lacks it leaves its shards out).
        let mut theirs = Vec::with_capacity(self.others.len());
        for (reader, pending) in self.others.iter_mut().zip(&mut self.pending) {
            while pending.as_ref().is_none_or(|p| p.step < step.step) {
                match reader.next_step()? {
                    Some(next) => *pending = Some(next),
                    None => break,
                }
            }
            theirs.push(pending.take_if(|p| p.step == step.step));
        }
        let sharded: Vec<ShardedTensor> = match theirs.iter().map(Option::as_ref).collect::<Option<Vec<_>>>() {
            Some(others) => {
                let all: Vec<&StepRecord> = std::iter::once(&step).chain(others).collect();
                sharded_tensors(&all).into_iter().filter_map(Result::ok).collect()
            }
            None => Vec::new(),
        };
        let mut wholes: BTreeMap<String, TensorRecord> = BTreeMap::new();
        for s in &sharded {
            if let Some(bytes) = self.whole_bytes(rank0, &step, &theirs, s)? {
                let record = step.tensors.iter().find(|t| t.name == s.name).expect("rank 0's shard");
                let hash = rank0.header().data_hash.tensor_hash(s.dtype, &s.whole, &bytes);
                let whole = TensorRecord {
                    shape: s.whole.clone(),
                    hash,
                    inline: Some(bytes),
                    in_payload: false,
                    shard: None,
                    reduce_scatter: None,
                    ..record.clone()
                };
                wholes.insert(s.name.clone(), whole);
            }
        }
        self.assembled += wholes.len() as u64;
        step.tensors = std::mem::take(&mut step.tensors)
            .into_iter()
            .map(|t| match &t.shard {
                Some(_) => wholes.remove(&t.name).unwrap_or_else(|| whole_already(t)),
                None => t,
            })
            .collect();
        Ok(step)
    }

    /// The whole's row-major bytes, when every rank stored its shard's values (asked first, so
    /// that a hash-only step allocates nothing).
    fn whole_bytes(
        &mut self,
        rank0: &mut TraceReader,
        step: &StepRecord,
        theirs: &[Option<StepRecord>],
        s: &ShardedTensor,
    ) -> Result<Option<Vec<u8>>, TraceError> {
        // The step each block's rank recorded.
        let record_of = |rank: u64| -> &StepRecord {
            match rank {
                0 => step,
                r => theirs[r as usize - 1].as_ref().expect("every rank's step"),
            }
        };
        fn shard_in<'r>(record: &'r StepRecord, name: &str) -> &'r TensorRecord {
            record.tensors.iter().find(|t| t.name == name).expect("the rank's shard")
        }
        let stored = s.blocks.iter().all(|b| {
            let reader = if b.rank == 0 { &*rank0 } else { &self.others[b.rank as usize - 1] };
            let record = record_of(b.rank);
            reader.has_values(record, shard_in(record, &s.name))
        });
        if !stored {
            return Ok(None);
        }
        let size = s.dtype.size_in_bytes();
        let numel: u64 = s.whole.iter().product();
        let mut bytes = vec![0u8; numel as usize * size];
        for block in &s.blocks {
            let reader = if block.rank == 0 { &mut *rank0 } else { &mut self.others[block.rank as usize - 1] };
            let record = record_of(block.rank);
            let Some(values) = reader.values(record, shard_in(record, &s.name))? else { return Ok(None) };
            place(&mut bytes, &s.whole, size, block, &values.bytes);
        }
        Ok(Some(bytes))
    }
}

/// A shard that is all of its whole (a world of one, or a tensor too small to split) as the
/// whole it is, hash included; any other shard as it is.
fn whole_already(mut t: TensorRecord) -> TensorRecord {
    if t.shard.as_ref().is_some_and(|s| repro_trace::shard::is_whole(&t, s)) {
        t.shard = None;
    }
    t
}
