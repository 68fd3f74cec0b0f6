//! Aligning two steps' tensor lists. When both record the same names in the same order (the
//! usual case) tensors pair up one to one. When the op sequences differ (code changed, other
//! options), a sequence diff (the `similar` crate, Myers' algorithm) finds what was inserted,
//! removed or renamed, so the rest still compares. It runs over names, except for the nodes of
//! a captured graph: their names are positional (`scope#k`), so one op inserted in a scope
//! renumbers the rest of it, and they are diffed by structure instead (scope, dtype, shape).

use repro_trace::TensorRecord;
use similar::{capture_diff_slices, Algorithm, DiffOp};
use std::collections::BTreeMap;

/// How one tensor of either step lines up with the other step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Pairing<'a> {
    /// Same name in both.
    Same(&'a TensorRecord, &'a TensorRecord),
    /// Different names at the same place of the sequence, same dtype and shape.
    Renamed(&'a TensorRecord, &'a TensorRecord),
    /// Captured nodes of the same scope, dtype and shape at the same place of the graph, under
    /// other ordinals: the scope's graph changed before them.
    Moved(&'a TensorRecord, &'a TensorRecord),
    /// Only in the first step (removed in the second).
    OnlyA(&'a TensorRecord),
    /// Only in the second step (inserted in the second).
    OnlyB(&'a TensorRecord),
}

/// Pairs the tensors of two steps, in the first step's order with the second's insertions
/// at their place.
pub(crate) fn align<'a>(a: &'a [TensorRecord], b: &'a [TensorRecord]) -> Vec<Pairing<'a>> {
    if a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.name == y.name) {
        return a.iter().zip(b).map(|(x, y)| Pairing::Same(x, y)).collect();
    }
    let (keys_a, keys_b): (Vec<String>, Vec<String>) = (a.iter().map(key).collect(), b.iter().map(key).collect());
    let names_a: Vec<&str> = keys_a.iter().map(String::as_str).collect();
    let names_b: Vec<&str> = keys_b.iter().map(String::as_str).collect();
    // Tensors that moved keep their name: pair them by name whatever the sequence diff says
    // (not captured nodes, whose keys many share).
    let b_index: BTreeMap<&str, usize> =
        names_b.iter().enumerate().filter(|(j, _)| named(&b[*j])).map(|(i, n)| (*n, i)).collect();
    let a_index: BTreeMap<&str, usize> =
        names_a.iter().enumerate().filter(|(i, _)| named(&a[*i])).map(|(i, n)| (*n, i)).collect();
    let mut out = Vec::new();
    for op in name_diff(&names_a, &names_b, &a_index) {
        match op {
            DiffOp::Equal { old_index, new_index, len } => {
                out.extend((0..len).map(|k| same_place(&a[old_index + k], &b[new_index + k])));
            }
            DiffOp::Delete { old_index, old_len, .. } => {
                out.extend(
                    (old_index..old_index + old_len).filter_map(|i| moved_or_only_a(a, b, &keys_a, &b_index, i)),
                );
            }
            DiffOp::Insert { new_index, new_len, .. } => {
                out.extend(
                    (new_index..new_index + new_len)
                        .filter(|&j| !a_index.contains_key(names_b[j]))
                        .map(|j| Pairing::OnlyB(&b[j])),
                );
            }
            DiffOp::Replace { old_index, old_len, new_index, new_len } => {
                let olds: Vec<usize> = (old_index..old_index + old_len).collect();
                let news: Vec<usize> =
                    (new_index..new_index + new_len).filter(|&j| !a_index.contains_key(names_b[j])).collect();
                let mut news = news.into_iter().peekable();
                for i in olds {
                    if let Some(p) =
                        moved_or_only_a(a, b, &keys_a, &b_index, i).filter(|p| matches!(p, Pairing::Same(..)))
                    {
                        out.push(p);
                        continue;
                    }
                    match news.peek() {
                        Some(&j) if a[i].dtype == b[j].dtype && a[i].shape == b[j].shape => {
                            out.push(same_place(&a[i], &b[j]));
                            news.next();
                        }
                        _ => out.push(Pairing::OnlyA(&a[i])),
                    }
                }
                out.extend(news.map(|j| Pairing::OnlyB(&b[j])));
            }
        }
    }
    out
}

/// The sequence diff of two steps' names. Myers' algorithm costs O((N + M) D) for D
/// differences, quadratic when no name is shared (120,000 renamed tensors took 12 to 20 s a
/// step); then the answer is known without it: one run of `a` replaced by one run of `b`,
/// which is what Myers' diff gives too.
fn name_diff(names_a: &[&str], names_b: &[&str], a_index: &BTreeMap<&str, usize>) -> Vec<DiffOp> {
    if names_b.iter().any(|n| a_index.contains_key(n)) {
        return capture_diff_slices(Algorithm::Myers, names_a, names_b);
    }
    vec![DiffOp::Replace { old_index: 0, old_len: names_a.len(), new_index: 0, new_len: names_b.len() }]
}

/// What two tensors at the same place of their sequences are: the same tensor, a renamed one,
/// or a captured node under another ordinal of its scope.
fn same_place<'a>(x: &'a TensorRecord, y: &'a TensorRecord) -> Pairing<'a> {
    match (x.name == y.name, x.node.is_some() && y.node.is_some() && scope(&x.name) == scope(&y.name)) {
        (true, _) => Pairing::Same(x, y),
        (false, true) => Pairing::Moved(x, y),
        (false, false) => Pairing::Renamed(x, y),
    }
}

/// What the sequence diff compares: a tensor's name, or for a captured node its scope, dtype and
/// shape (its ordinal shifts when an op is inserted before it).
fn key(t: &TensorRecord) -> String {
    match t.node {
        Some(_) => format!("{}\u{0}{}\u{0}{:?}", scope(&t.name), t.dtype, t.shape),
        None => t.name.clone(),
    }
}

/// The scope of a captured node's name: `h[0]/attn` of `h[0]/attn#3`, `lm_head` of `lm_head#5+2`.
pub(crate) fn scope(name: &str) -> &str {
    name.rsplit_once('#').map_or(name, |(scope, _)| scope)
}

/// Whether a tensor is known by its name alone: any tensor but a captured node numbered within
/// its scope (`S#k`), whose number shifts when an op is inserted before it (a node named by its
/// module path, as PyTorch's module outputs are, keeps its name).
fn named(t: &TensorRecord) -> bool {
    t.node.is_none() || !t.name.contains('#')
}

/// A tensor of `a` the diff calls deleted: paired by name if it moved, else only in `a`.
fn moved_or_only_a<'a>(
    a: &'a [TensorRecord],
    b: &'a [TensorRecord],
    keys_a: &[String],
    b_index: &BTreeMap<&str, usize>,
    i: usize,
) -> Option<Pairing<'a>> {
    let by_name = if named(&a[i]) { b_index.get(keys_a[i].as_str()) } else { None };
    Some(match by_name {
        Some(&j) => Pairing::Same(&a[i], &b[j]),
        None => Pairing::OnlyA(&a[i]),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use repro_trace::dtype::DType;
    use repro_trace::TensorKind;

    fn t(name: &str, len: u64) -> TensorRecord {
        TensorRecord {
            shape: vec![len],
            ..TensorRecord::of_bytes(name, TensorKind::OpOutput, DType::F32, vec![0], &[])
        }
    }

    fn describe(p: &[Pairing]) -> Vec<String> {
        p.iter()
            .map(|p| match p {
                Pairing::Same(x, _) => format!("={}", x.name),
                Pairing::Renamed(x, y) | Pairing::Moved(x, y) => format!("{}>{}", x.name, y.name),
                Pairing::OnlyA(x) => format!("-{}", x.name),
                Pairing::OnlyB(y) => format!("+{}", y.name),
            })
            .collect()
    }

    #[test]
    fn insertions_removals_renames_and_moves() {
        let a = [t("x", 4), t("fc1", 8), t("relu", 8), t("fc2", 2), t("loss", 1)];
        let b = [t("x", 4), t("fc1", 8), t("gelu", 8), t("dropout", 8), t("fc2", 2), t("loss", 1)];
        assert_eq!(describe(&align(&a, &b)), ["=x", "=fc1", "relu>gelu", "+dropout", "=fc2", "=loss"]);
        let c = [t("x", 4), t("fc2", 2), t("loss", 1)];
        assert_eq!(describe(&align(&a, &c)), ["=x", "-fc1", "-relu", "=fc2", "=loss"]);
        let moved = [t("fc1", 8), t("x", 4), t("relu", 8), t("fc2", 2), t("loss", 1)];
        let d = describe(&align(&a, &moved));
        assert!(d.contains(&"=x".to_string()) && d.contains(&"=fc1".to_string()), "{d:?}");
        assert_eq!(d.len(), 5);
        // A different shape is not a rename.
        let e = [t("x", 4), t("fc1", 8), t("wide", 16), t("fc2", 2), t("loss", 1)];
        assert_eq!(describe(&align(&a, &e)), ["=x", "=fc1", "-relu", "+wide", "=fc2", "=loss"]);
    }

    #[test]
    fn steps_that_share_no_name_pair_as_myers_pairs_them_without_running_it() {
        // Shapes that differ now and then, and lengths that differ, so renames, removals and
        // insertions all occur.
        let a: Vec<TensorRecord> = (0..60).map(|i| t(&format!("a{i}"), 1 + (i % 7 == 0) as u64)).collect();
        let b: Vec<TensorRecord> = (0..45).map(|i| t(&format!("b{i}"), 1 + (i % 5 == 0) as u64)).collect();
        let names_a: Vec<&str> = a.iter().map(|t| t.name.as_str()).collect();
        let names_b: Vec<&str> = b.iter().map(|t| t.name.as_str()).collect();
        let myers = capture_diff_slices(Algorithm::Myers, &names_a, &names_b);
        let shortcut = name_diff(&names_a, &names_b, &BTreeMap::new());
        assert_eq!(shortcut, myers, "the shortcut gives Myers' own answer");
        let pairs = describe(&align(&a, &b));
        assert_eq!(pairs.len(), 60 + 45 - pairs.iter().filter(|p| p.contains('>')).count());
        // And a step of 20,000 renamed tensors aligns (Myers' quadratic path would take seconds).
        let big_a: Vec<TensorRecord> = (0..20_000).map(|i| t(&format!("x{i}"), 1)).collect();
        let big_b: Vec<TensorRecord> = (0..20_000).map(|i| t(&format!("y{i}"), 1)).collect();
        assert!(align(&big_a, &big_b).iter().all(|p| matches!(p, Pairing::Renamed(..))));
    }

    fn node(name: &str, len: u64, index: u64) -> TensorRecord {
        TensorRecord { node: Some(index), ..t(name, len) }
    }

    #[test]
    fn an_op_inserted_in_a_scope_shifts_its_ordinals_but_not_the_pairing() {
        // B computes one more op at the start of `attn` (an unfused norm, say): by name, every
        // later `attn#k` would pair with another op; by structure each finds its own.
        let a = [t("w", 4), node("attn#0", 16, 0), node("attn#1", 384, 1), node("attn#2", 8, 2)];
        let b = [t("w", 4), node("attn#0", 2, 0), node("attn#1", 16, 1), node("attn#2", 384, 2), node("attn#3", 8, 3)];
        let pairs: Vec<String> = align(&a, &b)
            .iter()
            .map(|p| match p {
                Pairing::Same(x, _) => x.name.clone(),
                Pairing::Moved(x, y) => format!("{}~{}", x.name, y.name),
                Pairing::Renamed(x, y) => format!("{}>{}", x.name, y.name),
                Pairing::OnlyA(x) => format!("-{}", x.name),
                Pairing::OnlyB(y) => format!("+{}", y.name),
            })
            .collect();
        assert_eq!(pairs, ["w", "+attn#0", "attn#0~attn#1", "attn#1~attn#2", "attn#2~attn#3"]);
        assert_eq!(scope("h[0]/attn#3"), "h[0]/attn");
        assert_eq!(scope("lm_head#5+2"), "lm_head");
    }
}
