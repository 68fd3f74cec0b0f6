//! A step as the comparison sees it: read with its shards made whole (`crate::shards`), cut
//! to the replicated state when runs of other world sizes are compared, and mapped by a name
//! map (renames, transposes) or given its captured scopes' outputs under their module paths,
//! while values are still read through the records the trace stores.

use crate::names::{NameMap, Run};
use crate::shards::Assembler;
use repro_trace::{MissingGradients, StepRecord, TensorKind, TensorRecord, TraceError, TraceReader};
use std::collections::{BTreeMap, BTreeSet};

/// The next step of `reader`, noted in `missing`, its shards made whole where `shards` can.
pub(super) fn read_step(
    reader: &mut TraceReader,
    shards: Option<&mut Assembler>,
    missing: &mut MissingGradients,
) -> Result<Option<StepRecord>, TraceError> {
    let step = reader.next_step()?;
    step.iter().for_each(|s| missing.observe(s));
    match (step, shards) {
        (Some(step), Some(shards)) => shards.assemble(reader, step).map(Some),
        (step, _) => Ok(step),
    }
}

/// What `leave_out_shards` did with the tensors still recorded as shards.
#[derive(Debug, Default)]
pub(super) struct ShardsLeftOut {
    /// Tensors left out whose whole dtype and shape agree in both steps: their values were not
    /// compared.
    pub not_compared: u64,
    /// Tensors whose whole dtype or shape differs, which the records say without any values: A's
    /// record and B's, each with the whole's shape and no shard.
    pub wholes_differ: Vec<(TensorRecord, TensorRecord)>,
}

/// The tensor `t` is part of, as its record says: its dtype and the whole's shape (a shard's
/// `whole`, else its own shape).
fn whole_record(t: &TensorRecord) -> TensorRecord {
    let shape = t.shard.as_ref().map_or_else(|| t.shape.clone(), |s| s.whole.clone());
    TensorRecord { shape, shard: None, ..t.clone() }
}

/// Leaves out of both steps every tensor that both record and either still records as a shard
/// (an assembler could not make it whole). A tensor only one step records stays, for the
/// comparison to name as missing.
pub(super) fn leave_out_shards(a: &mut StepRecord, b: &mut StepRecord) -> ShardsLeftOut {
    let in_b: BTreeMap<&str, &TensorRecord> = b.tensors.iter().map(|t| (t.name.as_str(), t)).collect();
    let in_a: BTreeSet<&str> = a.tensors.iter().map(|t| t.name.as_str()).collect();
    let sharded: BTreeSet<String> = a
        .tensors
        .iter()
        .chain(&b.tensors)
        .filter(|t| t.shard.is_some() && in_a.contains(t.name.as_str()) && in_b.contains_key(t.name.as_str()))
        .map(|t| t.name.clone())
        .collect();
    let mut left_out = ShardsLeftOut::default();
    for ta in a.tensors.iter().filter(|t| sharded.contains(&t.name)) {
        let (wa, wb) = (whole_record(ta), whole_record(in_b[ta.name.as_str()]));
        if (wa.dtype, &wa.shape) == (wb.dtype, &wb.shape) {
            left_out.not_compared += 1;
        } else {
            left_out.wholes_differ.push((wa, wb));
        }
    }
    for step in [a, b] {
        step.tensors.retain(|t| !sharded.contains(&t.name));
    }
    left_out
}

/// `step` with only the tensors replicas share with a run of any world size (see
/// `DiffOptions::replicated_state_only`).
pub(super) fn replicated_state(mut step: StepRecord) -> StepRecord {
    // Parameters and buffers are the model's state. A parameter's gradient is `NAME.grad` for a
    // parameter `NAME` of the step. Other gradients (of predictions, of activations) are per
    // example, and a rank's share of a sum is `NAME.grad.local`.
    let weights: BTreeSet<String> =
        step.tensors.iter().filter(|t| t.kind == TensorKind::Weight).map(|t| t.name.clone()).collect();
    step.tensors.retain(|t| match t.kind {
        TensorKind::Weight | TensorKind::Buffer => true,
        TensorKind::Gradient => t.name.strip_suffix(".grad").is_some_and(|p| weights.contains(p)),
        _ => false,
    });
    step
}

/// A step as compared, beside the step as the trace stores it. A name map renames and leaves out
/// records, and its transpose rules replace some by their transposes; values are still read
/// through the stored records, under the names the trace knows them by.
pub(super) struct ComparedStep {
    /// As the trace stores it.
    stored: StepRecord,
    /// As compared, when a name map changed it: the records, each with the index of its stored
    /// record (`None`: a transpose, which holds its values itself).
    mapped: Option<(Vec<TensorRecord>, Vec<Option<usize>>)>,
}

impl ComparedStep {
    /// `stored` (a step of run `run`) as `names` maps it. The names of tensors a transpose rule
    /// names whose values the step does not keep go to `left_out`.
    pub(super) fn new(
        stored: StepRecord,
        names: &NameMap,
        run: Run,
        reader: &mut TraceReader,
        left_out: &mut Vec<String>,
    ) -> Result<Self, TraceError> {
        if names.is_empty() {
            return Ok(ComparedStep { stored, mapped: None });
        }
        let (mut tensors, mut origin): (Vec<TensorRecord>, Vec<Option<usize>>) =
            names.apply(&stored).into_iter().map(|(t, i)| (t, Some(i))).unzip();
        for (t, from) in tensors.iter_mut().zip(&mut origin) {
            if t.shape.len() != 2 || !names.transposes(run, &t.name) {
                continue;
            }
            let index = from.expect("a record the map produced");
            let Some(values) = reader.values(&stored, &stored.tensors[index])? else {
                left_out.push(t.name.clone());
                continue;
            };
            let (rows, cols) = (t.shape[0] as usize, t.shape[1] as usize);
            let size = t.dtype.size_in_bytes();
            let mut bytes = vec![0u8; values.bytes.len()];
            for (i, row) in values.bytes.chunks_exact(cols * size).enumerate() {
                for (j, element) in row.chunks_exact(size).enumerate() {
                    bytes[(j * rows + i) * size..][..size].copy_from_slice(element);
                }
            }
            let shape = vec![t.shape[1], t.shape[0]];
            let hash = reader.header().data_hash.tensor_hash(t.dtype, &shape, &bytes);
            *t = TensorRecord { shape, hash, inline: Some(bytes), in_payload: false, view: None, ..t.clone() };
            *from = None;
        }
        Ok(ComparedStep { stored, mapped: Some((tensors, origin)) })
    }

    pub(super) fn step(&self) -> u64 {
        self.stored.step
    }

    /// The records compared.
    pub(super) fn tensors(&self) -> &[TensorRecord] {
        self.mapped.as_ref().map_or(&self.stored.tensors, |(tensors, _)| tensors)
    }

    /// Leaves the tensors of these (compared) names out.
    pub(super) fn leave_out(&mut self, names: &[String]) {
        if let (Some((tensors, origin)), false) = (&mut self.mapped, names.is_empty()) {
            let keep: Vec<bool> = tensors.iter().map(|t| !names.contains(&t.name)).collect();
            let mut flags = keep.iter();
            tensors.retain(|_| *flags.next().expect("one flag a record"));
            let mut flags = keep.iter();
            origin.retain(|_| *flags.next().expect("one flag a record"));
        }
    }

    /// Whether its captured graph's nodes are named by scope (`S#k`, a candle capture).
    pub(super) fn has_scoped_nodes(&self) -> bool {
        self.tensors().iter().any(|t| t.node.is_some() && t.name.contains('#'))
    }

    /// The names of the records compared.
    pub(super) fn names(&self) -> BTreeSet<String> {
        self.tensors().iter().map(|t| t.name.clone()).collect()
    }

    /// Adds, for each captured scope whose module path (`h[1]/mlp` stands for `h.1.mlp`) the
    /// other run records and this one does not, an alias of the scope's output under that path:
    /// its last node, nodes of scopes nested in it included (a module returns what its last
    /// submodule computed). The alias follows the node, deeper scopes first, as a PyTorch
    /// module's output follows its submodules'; it reads the node's values. So a candle port,
    /// captured scope by scope, pairs with its PyTorch origin's module outputs by name, with
    /// no name map.
    pub(super) fn alias_scope_outputs(&mut self, other: &BTreeSet<String>) {
        // Module path -> (index of the scope's last node, depth of the scope).
        let mut outputs: BTreeMap<String, (usize, usize)> = BTreeMap::new();
        for (i, t) in self.tensors().iter().enumerate() {
            let Some((scope, _)) = t.name.rsplit_once('#').filter(|_| t.node.is_some()) else { continue };
            let parts: Vec<&str> = scope.split('/').collect();
            for depth in 1..=parts.len() {
                let path = parts[..depth].join(".").replace('[', ".").replace(']', "");
                outputs.insert(path, (i, depth));
            }
        }
        let own = self.names();
        let mut aliases: Vec<(usize, usize, String)> = outputs
            .into_iter()
            .filter(|(path, _)| other.contains(path) && !own.contains(path))
            .map(|(path, (i, depth))| (i, depth, path))
            .collect();
        if aliases.is_empty() {
            return;
        }
        // After its node; deeper scopes first.
        aliases.sort_by(|x, y| x.0.cmp(&y.0).then(y.1.cmp(&x.1)).then(x.2.cmp(&y.2)));
        let stored = &self.stored;
        let (tensors, origin) =
            self.mapped.get_or_insert_with(|| (stored.tensors.clone(), (0..stored.tensors.len()).map(Some).collect()));
        let mut aliases = aliases.into_iter().peekable();
        let (mut with, mut with_origin) = (Vec::with_capacity(tensors.len()), Vec::with_capacity(origin.len()));
        for (i, (t, from)) in std::mem::take(tensors).into_iter().zip(std::mem::take(origin)).enumerate() {
            let mut added = Vec::new();
            while let Some((_, _, path)) = aliases.next_if(|(at, _, _)| *at == i) {
                added.push(TensorRecord { name: path, ..t.clone() });
            }
            with.push(t);
            with_origin.push(from);
            for alias in added {
                with.push(alias);
                with_origin.push(from);
            }
        }
        (*tensors, *origin) = (with, with_origin);
    }

    /// The record that holds `t`'s values, `t` being one of `tensors()`: its stored record.
    pub(super) fn holder<'s>(&'s self, t: &'s TensorRecord) -> &'s TensorRecord {
        let Some((tensors, origin)) = &self.mapped else { return t };
        let offset = (t as *const TensorRecord as usize).wrapping_sub(tensors.as_ptr() as usize);
        let index = offset / std::mem::size_of::<TensorRecord>();
        assert!(index < tensors.len() && std::ptr::eq(&tensors[index], t), "a record of this step");
        origin[index].map_or(t, |i| &self.stored.tensors[i])
    }

    /// Whether the trace holds `t`'s values.
    pub(super) fn has_values(&self, reader: &TraceReader, t: &TensorRecord) -> bool {
        reader.has_values(&self.stored, self.holder(t))
    }

    /// `t`'s values, where the trace holds them.
    pub(super) fn values<'r>(
        &'r self,
        reader: &'r mut TraceReader,
        t: &'r TensorRecord,
    ) -> Result<Option<repro_trace::TensorValues<'r>>, TraceError> {
        reader.values(&self.stored, self.holder(t))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use repro_trace::dtype::DType;
    use repro_trace::ShardOf;

    fn record(name: &str, kind: TensorKind) -> TensorRecord {
        TensorRecord::of_bytes(name, kind, DType::F32, vec![1], &[0; 4])
    }

    fn step(tensors: Vec<TensorRecord>) -> StepRecord {
        StepRecord { step: 0, payload: None, tensors, no_gradient: Vec::new() }
    }

    fn names(step: &StepRecord) -> Vec<&str> {
        step.tensors.iter().map(|t| t.name.as_str()).collect()
    }

    #[test]
    fn the_replicated_state_is_the_parameters_their_gradients_and_the_buffers() {
        let kept = replicated_state(step(vec![
            record("x", TensorKind::Input),
            record("w", TensorKind::Weight),
            record("bn.running_mean", TensorKind::Buffer),
            record("h", TensorKind::Activation),
            record("h.grad", TensorKind::Gradient),
            record("w.grad.local", TensorKind::Gradient),
            record("w.grad", TensorKind::Gradient),
            record("loss", TensorKind::Loss),
            record("w.updated", TensorKind::Weight),
            record("bn.running_mean.updated", TensorKind::Buffer),
        ]));
        assert_eq!(names(&kept), ["w", "bn.running_mean", "w.grad", "w.updated", "bn.running_mean.updated"]);
    }

    #[test]
    fn a_tensor_still_sharded_on_either_side_leaves_both_and_its_whole_is_still_compared() {
        let sharded = |name: &str, whole: u64| TensorRecord {
            shard: Some(ShardOf { whole: vec![whole], offset: vec![0] }),
            ..record(name, TensorKind::Weight)
        };
        let whole = |name: &str, dtype: DType, size: u64| TensorRecord {
            dtype,
            shape: vec![size],
            ..record(name, TensorKind::Weight)
        };
        let mut a = step(vec![
            sharded("w", 2),
            record("b", TensorKind::Weight),
            record("v", TensorKind::Weight),
            sharded("u", 3),
            sharded("only_a", 2),
            sharded("d", 2),
        ]);
        let mut b = step(vec![
            whole("w", DType::F32, 2),
            record("b", TensorKind::Weight),
            sharded("v", 1),
            whole("u", DType::F32, 4),
            whole("d", DType::BF16, 2),
        ]);
        let left_out = leave_out_shards(&mut a, &mut b);
        assert_eq!(left_out.not_compared, 2, "w and v: wholes of one dtype and shape");
        let differ: Vec<(&str, Vec<u64>, Vec<u64>)> =
            left_out.wholes_differ.iter().map(|(x, y)| (x.name.as_str(), x.shape.clone(), y.shape.clone())).collect();
        assert_eq!(differ, [("u", vec![3], vec![4]), ("d", vec![2], vec![2])]);
        assert_eq!(left_out.wholes_differ[1].1.dtype, DType::BF16);
        // A tensor only one side records stays, to be named missing.
        assert_eq!((names(&a), names(&b)), (vec!["b", "only_a"], vec!["b"]));
    }

    #[test]
    fn a_captured_scopes_last_node_stands_for_the_module_the_other_run_names() {
        let node = |name: &str, at: u64| TensorRecord { node: Some(at), ..record(name, TensorKind::OpOutput) };
        let stored = step(vec![node("h[0]/mlp#0", 0), node("h[0]/mlp#1", 1), node("h[0]/ln#0", 2), node("head#0", 3)]);
        let (_dir, mut reader) = reader_of_nothing();
        let mut compared =
            ComparedStep::new(stored, &NameMap::default(), Run::A, &mut reader, &mut Vec::new()).unwrap();
        assert!(compared.has_scoped_nodes());
        let other: BTreeSet<String> = ["h.0.mlp", "h.0", "head", "h.9"].into_iter().map(String::from).collect();
        compared.alias_scope_outputs(&other);
        let aliases: Vec<&str> = compared.tensors().iter().map(|t| t.name.as_str()).collect();
        // `h.0.mlp` after its last node; `h.0` (the block) after its last node, the layer norm's.
        assert_eq!(aliases, ["h[0]/mlp#0", "h[0]/mlp#1", "h.0.mlp", "h[0]/ln#0", "h.0", "head#0", "head"]);
        // An alias reads its node's record.
        let alias = &compared.tensors()[2];
        assert_eq!(compared.holder(alias).name, "h[0]/mlp#1");
    }

    /// A reader of an empty trace (and its folder), for steps that never read values.
    fn reader_of_nothing() -> (tempfile::TempDir, TraceReader) {
        let dir = tempfile::tempdir().unwrap();
        let trace = crate::testing::one_step_trace(&dir.path().join("t"), Vec::new());
        let reader = TraceReader::open(trace).unwrap();
        (dir, reader)
    }
}
