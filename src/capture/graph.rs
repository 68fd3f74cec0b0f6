//! The forward graph behind a root tensor (a loss, or logits), as an ordered list of named nodes.
//!
//! The nodes are candle's `Tensor::sorted_nodes()`: every tensor on a path from a variable to the
//! root. Stock candle does not expose a node's op or inputs, so a node is known by its position
//! in topological order (leaves first, the root last), its dtype and shape, and a name built from
//! the scopes it was created in (see `scope`). The order comes from a depth-first walk over the
//! ops' operands in their fixed order, so it is the same on every device and in every run of the
//! same code.

use super::scope::{tensor_number, ScopeSpan};
use crate::trace::{view, ViewOf};
use candle_core::Tensor;
use std::collections::BTreeMap;

/// One node of the captured graph.
#[derive(Debug, Clone)]
pub struct GraphNode {
    /// Position in topological order, leaves first.
    pub position: u64,
    /// The name the trace uses: the variable's name, `scope#k` for the k-th node created in a
    /// scope, or `anchor+k` for the k-th unscoped node after the last named one.
    pub name: String,
    /// Whether the node is a variable (a parameter: a leaf of the graph).
    pub is_variable: bool,
    /// Where its innermost scope was opened (`FILE:LINE`), when known.
    pub source: Option<String>,
    /// The tensor.
    pub tensor: Tensor,
}

/// Orders and names the nodes behind `root`. `variables` maps tensor ids of named variables to
/// their names; `spans` are the step's scopes. With `after`, only variables and tensors created
/// after the tensor of that id are kept (a forward pass's own nodes, without those of earlier
/// passes that a KV cache links in), before naming, so that names do not depend on them.
pub(crate) fn graph_nodes(
    root: &Tensor,
    variables: &BTreeMap<u64, String>,
    spans: &[ScopeSpan],
    after: Option<u64>,
) -> Vec<GraphNode> {
    let scope_names = display_paths(spans);
    let mut sorted: Vec<&Tensor> = root.sorted_nodes();
    sorted.reverse();
    if let Some(first) = after {
        sorted.retain(|t| t.is_variable() || tensor_number(t) > first);
    }
    let innermost = Innermost::new(spans);
    let mut per_scope = vec![0usize; spans.len()];
    // The last named node (an index into `nodes`), and how many unscoped nodes followed it.
    let mut anchor: Option<usize> = None;
    let mut since_anchor = 0usize;
    let mut nodes: Vec<GraphNode> = Vec::with_capacity(sorted.len());
    for (position, t) in sorted.into_iter().enumerate() {
        let id = tensor_number(t);
        let mut source = None;
        let name = if let Some(var) = variables.get(&id).filter(|_| t.is_variable()) {
            (anchor, since_anchor) = (Some(nodes.len()), 0);
            var.clone()
        } else if let Some(scope) = innermost.of(spans, id) {
            let name = format!("{}#{}", scope_names[scope], per_scope[scope]);
            per_scope[scope] += 1;
            (anchor, since_anchor) = (Some(nodes.len()), 0);
            source = spans[scope].source.clone();
            name
        } else {
            since_anchor += 1;
            format!("{}+{since_anchor}", anchor.map_or("graph", |a| nodes[a].name.as_str()))
        };
        let is_variable = t.is_variable();
        nodes.push(GraphNode { position: position as u64, name, is_variable, source, tensor: t.clone() });
    }
    nodes
}

/// For each node, the earlier node whose memory it reads through a layout of its own (a
/// transpose, a broadcast, a narrow, a reshape), as a view (`repro_trace::view`): the first
/// node of a storage that is contiguous and `recorded` owns it, and a later node of that storage
/// whose elements lie within the owner's is a view of it. `None` for the others: nodes with
/// memory of their own, and nodes of memory no recorded node owns whole.
pub(crate) fn views(nodes: &[GraphNode], recorded: impl Fn(&GraphNode) -> bool) -> Vec<Option<ViewOf>> {
    struct Owner {
        index: usize,
        start: usize,
        elements: u64,
    }
    // By the address of the storage the nodes share (all alive, held by `nodes`).
    let mut owners: BTreeMap<usize, Owner> = BTreeMap::new();
    let mut views = Vec::with_capacity(nodes.len());
    for (index, node) in nodes.iter().enumerate() {
        let (storage, layout) = node.tensor.storage_and_layout();
        let key = &*storage as *const candle_core::Storage as usize;
        let view = match owners.get(&key) {
            Some(owner) => layout.start_offset().checked_sub(owner.start).and_then(|offset| {
                let shape: Vec<u64> = layout.dims().iter().map(|&d| d as u64).collect();
                let strides: Vec<u64> = layout.stride().iter().map(|&s| s as u64).collect();
                view::within(&shape, offset as u64, &strides, owner.elements).then(|| ViewOf {
                    of: nodes[owner.index].name.clone(),
                    offset: offset as u64,
                    strides,
                })
            }),
            None => {
                if layout.is_contiguous() && recorded(node) {
                    let elements = node.tensor.elem_count() as u64;
                    owners.insert(key, Owner { index, start: layout.start_offset(), elements });
                }
                None
            }
        };
        views.push(view);
    }
    views
}

/// Finds the innermost scope that holds a tensor id. Scopes entered and left in order nest as
/// intervals, so they cut the ids into segments, each with one innermost scope, found by binary
/// search (a step may open hundreds of scopes, and every node asks).
enum Innermost {
    /// Where each segment starts, and its innermost scope; sorted by start.
    Segments(Vec<(u64, Option<usize>)>),
    /// The scopes do not nest (spans left out of order): every lookup scans them all.
    Scan,
}

impl Innermost {
    fn new(spans: &[ScopeSpan]) -> Innermost {
        let mut order: Vec<usize> = (0..spans.len()).collect();
        // Outer before inner where two start together.
        order.sort_by_key(|&i| (spans[i].start, std::cmp::Reverse(spans[i].end), spans[i].path.len()));
        let mut open: Vec<usize> = Vec::new();
        let mut segments = Vec::with_capacity(2 * spans.len());
        for i in order {
            let span = &spans[i];
            while let Some(&top) = open.last().filter(|&&top| spans[top].end <= span.start) {
                open.pop();
                segments.push((spans[top].end, open.last().copied()));
            }
            if open.last().is_some_and(|&top| spans[top].end < span.end) {
                return Innermost::Scan;
            }
            segments.push((span.start, Some(i)));
            open.push(i);
        }
        while let Some(top) = open.pop() {
            segments.push((spans[top].end, open.last().copied()));
        }
        Innermost::Segments(segments)
    }

    /// The innermost scope whose id interval holds `id`: the deepest, and of equally deep ones
    /// the latest entered.
    fn of(&self, spans: &[ScopeSpan], id: u64) -> Option<usize> {
        match self {
            Innermost::Segments(segments) => {
                let after = segments.partition_point(|&(start, _)| start <= id);
                after.checked_sub(1).and_then(|k| segments[k].1)
            }
            Innermost::Scan => spans
                .iter()
                .enumerate()
                .filter(|(_, s)| s.start <= id && id < s.end)
                .max_by_key(|(_, s)| (s.path.len(), s.start))
                .map(|(i, _)| i),
        }
    }
}

/// One level of a scope path: its name and its ordinal among same-named siblings.
type ScopeLevel = (String, usize);

/// Each scope's path as text: `layers[3]/attn/linear[1]`, with an ordinal on a level only where
/// its parent holds several scopes of that name.
fn display_paths(spans: &[ScopeSpan]) -> Vec<String> {
    // How many same-named siblings each (parent path, name) has: the highest ordinal + 1.
    let mut siblings: BTreeMap<(&[ScopeLevel], &str), usize> = BTreeMap::new();
    for s in spans {
        for depth in 0..s.path.len() {
            let (name, ordinal) = &s.path[depth];
            let count = siblings.entry((&s.path[..depth], name.as_str())).or_insert(0);
            *count = (*count).max(ordinal + 1);
        }
    }
    spans
        .iter()
        .map(|s| {
            let levels: Vec<String> = (0..s.path.len())
                .map(|depth| {
                    let (name, ordinal) = &s.path[depth];
                    if siblings[&(&s.path[..depth], name.as_str())] > 1 {
                        format!("{name}[{ordinal}]")
                    } else {
                        name.clone()
                    }
                })
                .collect();
            levels.join("/")
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::scope::{scope, take_step};
    use super::*;
    use candle_core::{DType, Device, Var};

    #[test]
    fn nodes_are_named_by_variable_scope_or_anchor_in_topological_order() {
        let dev = Device::Cpu;
        let w = Var::ones((2, 2), DType::F32, &dev).unwrap();
        let x = Tensor::ones((1, 2), DType::F32, &dev).unwrap();
        take_step();
        let h = scope("layer", || scope("linear", || x.matmul(w.as_tensor()).unwrap()));
        let h = h.relu().unwrap();
        let loss = scope("loss", || h.sum_all().unwrap());
        let spans = take_step();
        let vars = BTreeMap::from([(tensor_number(w.as_tensor()), "layer.weight".to_string())]);
        let nodes = graph_nodes(&loss, &vars, &spans, None);
        let names: Vec<&str> = nodes.iter().map(|n| n.name.as_str()).collect();
        // sum_all is two candle ops (a sum and a reshape): both land in the `loss` scope.
        assert_eq!(names, ["layer.weight", "layer/linear#0", "layer/linear#0+1", "loss#0", "loss#1"]);
        assert!(nodes[0].is_variable && !nodes[1].is_variable);
        let positions: Vec<u64> = nodes.iter().map(|n| n.position).collect();
        assert_eq!(positions, [0, 1, 2, 3, 4]);
    }

    /// Nested scopes of many shapes (empty ones, ones that start or end together, deep chains):
    /// the segment search finds what a scan of every scope finds, for every id.
    #[test]
    fn the_segment_search_finds_the_innermost_scope_like_a_scan() {
        // Scopes as a deterministic random walk of enters and exits over ids 0..400.
        let mut spans: Vec<ScopeSpan> = Vec::new();
        let mut open: Vec<usize> = Vec::new();
        let mut state = 0x2545_f491_4f6c_dd1du64;
        for id in 0..400u64 {
            for _ in 0..3 {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                match state % 4 {
                    0 | 1 if open.len() < 6 => {
                        let path = (0..=open.len()).map(|d| (format!("s{d}"), 0)).collect();
                        open.push(spans.len());
                        spans.push(ScopeSpan { path, start: id, end: u64::MAX, source: None });
                    }
                    2 => {
                        if let Some(i) = open.pop() {
                            spans[i].end = id;
                        }
                    }
                    _ => {}
                }
            }
        }
        assert!(spans.len() > 100, "{} scopes", spans.len());
        let segments = Innermost::new(&spans);
        assert!(matches!(segments, Innermost::Segments(_)), "nested scopes are searched, not scanned");
        for id in 0..410 {
            assert_eq!(segments.of(&spans, id), Innermost::Scan.of(&spans, id), "id {id}");
        }
        // Scopes that overlap without nesting fall back to the scan.
        let overlapping = [
            ScopeSpan { path: vec![("a".into(), 0)], start: 0, end: 5, source: None },
            ScopeSpan { path: vec![("b".into(), 0)], start: 3, end: 8, source: None },
        ];
        assert!(matches!(Innermost::new(&overlapping), Innermost::Scan));
    }

    #[test]
    fn repeated_scopes_get_ordinals_and_single_ones_do_not() {
        let span = |path: &[(&str, usize)], start| ScopeSpan {
            path: path.iter().map(|(n, o)| (n.to_string(), *o)).collect(),
            start,
            end: start + 1,
            source: None,
        };
        let spans = [
            span(&[("layers", 0), ("attn", 0)], 1),
            span(&[("layers", 0)], 1),
            span(&[("layers", 1), ("attn", 0)], 3),
            span(&[("layers", 1), ("linear", 0)], 4),
            span(&[("layers", 1), ("linear", 1)], 5),
            span(&[("layers", 1)], 3),
        ];
        let names = display_paths(&spans);
        assert_eq!(
            names,
            [
                "layers[0]/attn",
                "layers[0]",
                "layers[1]/attn",
                "layers[1]/linear[0]",
                "layers[1]/linear[1]",
                "layers[1]"
            ]
        );
    }
}
