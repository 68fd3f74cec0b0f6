//! The plan of one batched hashing pass over many tensor views: the tables the kernels of
//! `kernels/repro.cu` (section 1b) read, and where each view's result lands in the output.
//!
//! Hashing thousands of small tensors one kernel launch at a time costs more than the
//! hashing itself, so a step's views are hashed together: one launch for all chunks, one per
//! four tree levels, one for the roots, and one copy launch for the views whose values the host
//! keeps. The plan is pure arithmetic on addresses, shapes and strides; `ops::cuda` runs it on a
//! GPU, and the tests run the very same kernels compiled for the host (crates/kernel-host-check).

use std::ops::Range;

/// Words per view in the kernels' view table (`VIEW_WORDS` in kernels/repro.cu).
pub const VIEW_WORDS: usize = 21;
/// Dimensions a view may have after merging (`VIEW_DIMS` in kernels/repro.cu).
pub const VIEW_DIMS: usize = 8;
/// Tree levels one parent launch merges, at most (`LEVELS_PER_LAUNCH` in kernels/repro.cu).
pub const LEVELS_PER_LAUNCH: u64 = 4;
/// Bytes of one BLAKE3 chunk: views this small are copied and hashed on the host.
const CHUNK_LEN: u64 = 1024;

/// A tensor view as the kernels read it: the address of element 0, the element size, and the
/// shape with strides in elements.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct View {
    /// Address of the view's first element.
    pub address: u64,
    /// Bytes per element.
    pub elem_size: u64,
    /// The view's shape.
    pub dims: Vec<usize>,
    /// Its strides, in elements (0 where it broadcasts).
    pub strides: Vec<usize>,
}

impl View {
    /// Bytes of the view's elements in row-major order.
    pub fn byte_len(&self) -> u64 {
        self.dims.iter().product::<usize>() as u64 * self.elem_size
    }

    /// Whether the kernels can read the view as it is (see `merged`).
    pub fn fits(&self) -> bool {
        self.merged().is_some()
    }

    /// The same view with size-1 dimensions dropped and dimensions that are contiguous with
    /// each other merged; `None` if more than `VIEW_DIMS` remain.
    fn merged(&self) -> Option<(Vec<u64>, Vec<u64>)> {
        let mut dims: Vec<u64> = Vec::new();
        let mut strides: Vec<u64> = Vec::new();
        for (&d, &s) in self.dims.iter().zip(&self.strides).filter(|(&d, _)| d != 1) {
            match (dims.last_mut(), strides.last_mut()) {
                (Some(last_d), Some(last_s)) if *last_s == s as u64 * d as u64 => {
                    *last_d *= d as u64;
                    *last_s = s as u64;
                }
                _ => {
                    dims.push(d as u64);
                    strides.push(s as u64);
                }
            }
        }
        (dims.len() <= VIEW_DIMS).then_some((dims, strides))
    }
}

/// What the host asks of a view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Want {
    /// Its BLAKE3 data hash (computed on the device when it holds more than one chunk).
    Hash,
    /// Its bytes in row-major order.
    Bytes,
}

/// Where a view's result is in the output buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Slot {
    /// The 32-byte BLAKE3 hash of the view's bytes.
    Hash(Range<usize>),
    /// The view's bytes, in row-major order (the host hashes them if it asked for a hash).
    Bytes(Range<usize>),
}

/// One parent launch: rows `(first input node, inputs, first output node, levels merged)` and
/// their prefix table, as word ranges of the plan's table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Level {
    /// The rows.
    pub rows: Range<usize>,
    /// Their prefix table (output nodes before each row).
    pub prefix: Range<usize>,
    /// Number of rows: views whose tree still has more than two nodes.
    pub views: u64,
    /// Output nodes of the level in all.
    pub outputs: u64,
}

/// A pass over several views: the view table and its work-item prefix, as word ranges of the
/// plan's table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pass {
    /// The views, `VIEW_WORDS` words each.
    pub views: Range<usize>,
    /// Work items before each view.
    pub prefix: Range<usize>,
    /// Number of views.
    pub count: u64,
    /// Work items in all (chunks, or elements to copy).
    pub items: u64,
}

/// The tables of one batch and the passes to run over them, in order: `chunks`, each of
/// `levels` (up to `LEVELS_PER_LAUNCH` tree levels each), `roots` (each view's last two nodes,
/// one root per view), then `copy`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// Everything the kernels read, uploaded in one copy.
    pub table: Vec<u64>,
    /// The chunk pass over the views hashed on the device.
    pub chunks: Option<Pass>,
    /// The parent launches, in this order.
    pub levels: Vec<Level>,
    /// Word range of the per-view node index of the last two nodes.
    pub roots: Range<usize>,
    /// Chaining values the tree needs room for (8 words each).
    pub nodes: u64,
    /// The copy pass over the views whose bytes the host gets.
    pub copy: Option<Pass>,
    /// Word range of the copy's per-view output byte offsets.
    pub copy_out: Range<usize>,
    /// Bytes of the output buffer: hashes first, then copied bytes.
    pub out_len: usize,
    /// Each view's result, in the order the views were given.
    pub slots: Vec<Slot>,
}

impl Plan {
    /// Plans the batch; `None` if a view has more than `VIEW_DIMS` dimensions that cannot be
    /// merged (the caller makes such a view contiguous first).
    pub fn new(views: &[(View, Want)]) -> Option<Plan> {
        let mut hashed: Vec<(usize, Vec<u64>, u64)> = Vec::new(); // (view, words, chunks)
        let mut copied: Vec<(usize, Vec<u64>, u64)> = Vec::new(); // (view, words, elements)
        for (i, (view, want)) in views.iter().enumerate() {
            let words = view_words(view)?;
            let len = view.byte_len();
            if *want == Want::Hash && len > CHUNK_LEN {
                hashed.push((i, words, len.div_ceil(CHUNK_LEN)));
            } else {
                copied.push((i, words, len / view.elem_size));
            }
        }
        let mut plan = Plan::default();
        let mut slots = vec![Slot::Bytes(0..0); views.len()];
        for (k, (i, _, _)) in hashed.iter().enumerate() {
            slots[*i] = Slot::Hash(32 * k..32 * (k + 1));
        }
        let mut out_len = 32 * hashed.len();
        if !hashed.is_empty() {
            plan.chunks = Some(plan.pass(&hashed));
            // Node 0.. are the chunks; every level appends its outputs after the last level.
            let mut current: Vec<(u64, u64)> = Vec::new(); // (first node, count) per view
            let mut next_free = 0;
            for (_, _, chunks) in &hashed {
                current.push((next_free, *chunks));
                next_free += chunks;
            }
            while current.iter().any(|&(_, n)| n > 2) {
                let (mut rows, mut prefix, mut outputs) = (Vec::new(), vec![0], 0);
                for (first, n) in current.iter_mut().filter(|(_, n)| *n > 2) {
                    // Up to LEVELS_PER_LAUNCH levels, stopping where two nodes remain.
                    let (mut out, mut depth) = (*n, 0);
                    while out > 2 && depth < LEVELS_PER_LAUNCH {
                        out = out.div_ceil(2);
                        depth += 1;
                    }
                    rows.extend([*first, *n, next_free, depth]);
                    (*first, *n) = (next_free, out);
                    next_free += out;
                    outputs += out;
                    prefix.push(outputs);
                }
                let views = rows.len() as u64 / 4;
                let rows = plan.push(&rows);
                let prefix = plan.push(&prefix);
                plan.levels.push(Level { rows, prefix, views, outputs });
            }
            plan.nodes = next_free;
            let roots: Vec<u64> = current.iter().map(|&(first, _)| first).collect();
            plan.roots = plan.push(&roots);
        }
        if !copied.is_empty() {
            plan.copy = Some(plan.pass(&copied));
            let mut at = Vec::with_capacity(copied.len());
            for (i, _, elements) in &copied {
                let len = (*elements * views[*i].0.elem_size) as usize;
                at.push(out_len as u64);
                slots[*i] = Slot::Bytes(out_len..out_len + len);
                out_len += len;
            }
            plan.copy_out = plan.push(&at);
        }
        plan.out_len = out_len;
        plan.slots = slots;
        Some(plan)
    }

    fn push(&mut self, words: &[u64]) -> Range<usize> {
        let start = self.table.len();
        self.table.extend_from_slice(words);
        start..self.table.len()
    }

    /// Appends the view table and work-item prefix of one pass.
    fn pass(&mut self, views: &[(usize, Vec<u64>, u64)]) -> Pass {
        let table = self.push(&views.iter().flat_map(|(_, w, _)| w.iter().copied()).collect::<Vec<_>>());
        let mut prefix = vec![0];
        for (_, _, items) in views {
            prefix.push(prefix.last().unwrap() + items);
        }
        let items = *prefix.last().unwrap();
        Pass { views: table, prefix: self.push(&prefix), count: views.len() as u64, items }
    }
}

/// The kernels' `VIEW_WORDS` words for one view.
fn view_words(view: &View) -> Option<Vec<u64>> {
    let (dims, strides) = view.merged()?;
    let contiguous = dims.is_empty() || (dims.len() == 1 && strides[0] == 1);
    let mut words = vec![0u64; VIEW_WORDS];
    words[0] = view.address;
    words[1] = view.elem_size;
    words[2] = dims.len() as u64;
    words[3] = contiguous as u64;
    words[4] = view.byte_len();
    words[5..5 + dims.len()].copy_from_slice(&dims);
    words[5 + VIEW_DIMS..5 + VIEW_DIMS + strides.len()].copy_from_slice(&strides);
    Some(words)
}

#[cfg(test)]
mod tests {
    //! The plan run through the device kernels compiled for the host, against the blake3 crate
    //! and a plain row-major read of each view.
    use super::*;
    use kernel_host_check as kernels;

    /// Runs a plan the way `ops::cuda` does, on the host; returns the output buffer.
    fn run(plan: &Plan) -> Vec<u8> {
        let t = &plan.table;
        let mut out = vec![0u8; plan.out_len];
        if let Some(chunks) = &plan.chunks {
            let mut nodes = vec![0u32; 8 * plan.nodes as usize];
            kernels::hash_chunks(&t[chunks.views.clone()], &t[chunks.prefix.clone()], &mut nodes);
            for level in &plan.levels {
                kernels::hash_parents(&t[level.rows.clone()], &t[level.prefix.clone()], &mut nodes);
            }
            let roots = &t[plan.roots.clone()];
            let mut hashes = vec![0u32; 8 * roots.len()];
            kernels::hash_roots(roots, &nodes, &mut hashes);
            for (i, w) in hashes.iter().enumerate() {
                out[4 * i..4 * i + 4].copy_from_slice(&w.to_le_bytes());
            }
        }
        if let Some(copy) = &plan.copy {
            kernels::copy_views(&t[copy.views.clone()], &t[copy.prefix.clone()], &t[plan.copy_out.clone()], &mut out);
        }
        out
    }

    /// Row-major bytes of a view over `memory`, read element by element.
    fn row_major(memory: &[u8], view: &View) -> Vec<u8> {
        let n: usize = view.dims.iter().product();
        let es = view.elem_size as usize;
        let base = view.address as usize - memory.as_ptr() as usize;
        let mut bytes = Vec::with_capacity(n * es);
        for mut e in 0..n {
            let mut off = 0;
            for (d, s) in view.dims.iter().zip(&view.strides).rev() {
                off += (e % d) * s;
                e /= d;
            }
            bytes.extend_from_slice(&memory[base + off * es..base + off * es + es]);
        }
        bytes
    }

    fn view(memory: &[u8], offset: usize, elem_size: u64, dims: &[usize], strides: &[usize]) -> View {
        View {
            address: memory.as_ptr() as u64 + offset as u64,
            elem_size,
            dims: dims.to_vec(),
            strides: strides.to_vec(),
        }
    }

    fn contiguous_strides(dims: &[usize]) -> Vec<usize> {
        let mut strides = vec![1; dims.len()];
        for i in (0..dims.len().saturating_sub(1)).rev() {
            strides[i] = strides[i + 1] * dims[i + 1];
        }
        strides
    }

    /// Many views of every kind in one batch: contiguous at aligned and odd offsets, transposed,
    /// broadcast (stride 0), narrowed, 1- to 8-byte elements, empty, smaller and larger than a
    /// chunk, with trees of 2 to 700 chunks; each hash must be BLAKE3 of its row-major bytes and
    /// each copy exactly those bytes.
    #[test]
    fn one_batch_hashes_and_copies_every_kind_of_view_like_the_reference() {
        let memory: Vec<u8> = (0..3_000_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        let mut views = Vec::new();
        for (es, offset) in [(4u64, 0usize), (4, 4), (2, 2), (1, 1), (8, 8), (4, 12)] {
            for len in [0usize, 1, 255, 256, 257, 1024, 1025, 4096, 100_000, 700 * 1024 / 4] {
                let dims = [len];
                views.push((view(&memory, offset, es, &dims, &[1]), Want::Hash));
            }
        }
        // A [64, 48] f32 matrix transposed, a narrowed window of it, a broadcast row, a bf16
        // 4-d permutation, and an 8-byte view with a stride of 3 elements.
        views.push((view(&memory, 64, 4, &[48, 64], &[1, 48]), Want::Hash));
        views.push((view(&memory, 64 + 4 * 48 * 5, 4, &[10, 30], &[48, 1]), Want::Hash));
        views.push((view(&memory, 128, 4, &[300, 48], &[0, 1]), Want::Hash));
        views.push((view(&memory, 6, 2, &[3, 5, 7, 11], &[1, 3, 15, 105]), Want::Hash));
        views.push((view(&memory, 16, 8, &[500], &[3]), Want::Hash));
        // Strided views of 1- and 2-byte elements across several chunks, and a 3-d permutation
        // whose rows end inside blocks.
        views.push((view(&memory, 3, 1, &[40, 60], &[1, 40]), Want::Hash));
        views.push((view(&memory, 2, 2, &[70, 40], &[1, 70]), Want::Hash));
        views.push((view(&memory, 4, 4, &[7, 13, 9], &[1, 63, 7]), Want::Hash));
        views.push((view(&memory, 64, 4, &[48, 64], &[1, 48]), Want::Bytes));
        views.push((view(&memory, 16, 8, &[2, 70], &[140, 2]), Want::Bytes));
        views.push((view(&memory, 100, 1, &[1, 1, 5000], &[7, 7, 1]), Want::Bytes));
        let plan = Plan::new(&views).expect("every view fits the kernels");
        // 700 chunks are 9 levels below the root's two nodes: 4 + 4 + 1.
        assert_eq!(plan.levels.len(), 3, "a 700-chunk tree takes three parent launches");
        let out = run(&plan);
        for (i, ((view, want), slot)) in views.iter().zip(&plan.slots).enumerate() {
            let bytes = row_major(&memory, view);
            match slot {
                Slot::Hash(r) => {
                    assert_eq!(*want, Want::Hash);
                    assert_eq!(&out[r.clone()], blake3::hash(&bytes).as_bytes(), "view {i}: {view:?}");
                }
                Slot::Bytes(r) => assert_eq!(&out[r.clone()], &bytes[..], "view {i}: {view:?}"),
            }
        }
    }

    #[test]
    fn only_views_of_more_than_one_chunk_are_hashed_on_the_device() {
        let memory = vec![7u8; 8192];
        let small = view(&memory, 0, 4, &[256], &[1]);
        let large = view(&memory, 0, 4, &[257], &[1]);
        let plan = Plan::new(&[(small.clone(), Want::Hash), (large, Want::Hash), (small, Want::Bytes)]).unwrap();
        assert_eq!(plan.slots, vec![Slot::Bytes(32..1056), Slot::Hash(0..32), Slot::Bytes(1056..2080)]);
        assert!(plan.levels.is_empty(), "two chunks go straight to the root");
    }

    #[test]
    fn contiguous_dimensions_merge_and_too_many_dimensions_are_refused() {
        let memory = vec![0u8; 4096];
        let dims = [2, 1, 3, 4];
        let merged = view(&memory, 0, 4, &dims, &contiguous_strides(&dims)).merged().unwrap();
        assert_eq!(merged, (vec![24], vec![1]));
        let transposed = view(&memory, 0, 4, &[3, 4], &[1, 3]).merged().unwrap();
        assert_eq!(transposed, (vec![3, 4], vec![1, 3]));
        // Nine dimensions that do not merge (every stride is three times the next).
        let dims = [2usize; 9];
        let strides: Vec<usize> = (0..9u32).rev().map(|k| 3usize.pow(k)).collect();
        assert!(Plan::new(&[(view(&memory, 0, 1, &dims, &strides), Want::Hash)]).is_none());
    }
}
