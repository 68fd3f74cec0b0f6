//! The plan of one batched hashing pass over many tensor views: the tables the kernels of
//! `kernels/hash.cu` read, and where each view's result lands in the output.
//!
//! Hashing thousands of small tensors one kernel launch at a time costs more than the
//! hashing itself, so a step's views are hashed together: one launch for all chunks, one per
//! four tree levels while a level is wide and per eight once it is narrow, one for the roots,
//! and one copy launch for the views whose values the host keeps. The plan is pure arithmetic on addresses, shapes and strides; `record::device::batch` runs it on a
//! GPU, and the tests run the very same kernels compiled for the host (crates/kernel-host-check).

use std::collections::hash_map::{Entry, HashMap};
use std::ops::Range;

/// Words per view in the kernels' view table (`VIEW_WORDS` in kernels/hash.cu).
pub const VIEW_WORDS: usize = 21;
/// Dimensions a view may have after merging (`VIEW_DIMS` in kernels/hash.cu).
pub const VIEW_DIMS: usize = 8;
/// Tree levels one parent launch merges, at most (`BLOCK_LEVELS` in kernels/hash.cu): a block of
/// threads per output node merges its up to 256 input nodes level by level, each level's nodes
/// in parallel, so a 1 GiB tensor's 2^20 chunks take three launches to the root's two nodes.
pub const BLOCK_LEVELS: u64 = 8;
/// Bytes of one BLAKE3 chunk: views this small are copied and hashed on the host.
const CHUNK_LEN: u64 = 1024;
/// Views whose values the host keeps are read back straight from their own memory from this
/// size on (`Slot::Direct`), not gathered into the output buffer: a step that keeps full values
/// then needs no device copy of them, whatever its size. Smaller ones are gathered, so that a
/// step's many small tensors cost one copy back rather than one each.
pub const DIRECT_MIN: u64 = 64 << 10;

/// A tensor view as the kernels read it: the address of element 0, the element size, and the
/// shape with strides in elements (borrowed from the tensor's layout: planning a step's views
/// allocates nothing per view).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct View<'a> {
    /// Address of the view's first element.
    pub address: u64,
    /// Bytes per element.
    pub elem_size: u64,
    /// The view's shape.
    pub dims: &'a [usize],
    /// Its strides, in elements (0 where it broadcasts).
    pub strides: &'a [usize],
}

impl View<'_> {
    /// Bytes of the view's elements in row-major order.
    pub fn byte_len(&self) -> u64 {
        self.dims.iter().product::<usize>() as u64 * self.elem_size
    }
}

/// Whether the kernels can read a view of these dims and strides as it is: at most `VIEW_DIMS`
/// dimensions once size-1 ones are dropped and contiguous ones merged.
pub fn fits(dims: &[usize], strides: &[usize]) -> bool {
    Merged::of(dims, strides).is_some()
}

/// A view's dimensions with size-1 dimensions dropped and dimensions that are contiguous with
/// each other merged: at most `VIEW_DIMS` of them.
#[derive(Debug, PartialEq, Eq)]
struct Merged {
    dims: [u64; VIEW_DIMS],
    strides: [u64; VIEW_DIMS],
    len: usize,
}

impl Merged {
    /// `None` if more than `VIEW_DIMS` dimensions remain after merging.
    fn of(dims: &[usize], strides: &[usize]) -> Option<Merged> {
        let mut m = Merged { dims: [0; VIEW_DIMS], strides: [0; VIEW_DIMS], len: 0 };
        for (&d, &s) in dims.iter().zip(strides).filter(|(&d, _)| d != 1) {
            let (d, s) = (d as u64, s as u64);
            if m.len > 0 && m.strides[m.len - 1] == s * d {
                m.dims[m.len - 1] *= d;
                m.strides[m.len - 1] = s;
            } else if m.len == VIEW_DIMS {
                return None;
            } else {
                (m.dims[m.len], m.strides[m.len]) = (d, s);
                m.len += 1;
            }
        }
        Some(m)
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
    /// The view's bytes, read back from its own memory rather than from the output buffer:
    /// values the host keeps, `DIRECT_MIN` bytes or more.
    Direct,
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
/// `levels` (up to `BLOCK_LEVELS` tree levels each), `roots` (each view's last two nodes,
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
        // Each view's table words and work items (chunks to hash, or elements to copy).
        let mut hashed: Vec<(usize, [u64; VIEW_WORDS], u64)> = Vec::new();
        let mut copied: Vec<(usize, [u64; VIEW_WORDS], u64)> = Vec::new();
        let mut direct: Vec<usize> = Vec::new();
        // Views that read the same bytes in the same order (a reshape of a contiguous tensor, the
        // same view recorded twice) have the same data hash: hashed once, the slot shared. The
        // tensors are all alive until the kernels run, so one address is one memory.
        let mut first_of: HashMap<[u64; VIEW_WORDS], usize> = HashMap::new();
        let mut shared: Vec<(usize, usize)> = Vec::new();
        for (i, (view, want)) in views.iter().enumerate() {
            let words = view_words(view)?;
            let len = view.byte_len();
            if *want == Want::Hash && len > CHUNK_LEN {
                match first_of.entry(words) {
                    Entry::Occupied(k) => shared.push((i, *k.get())),
                    Entry::Vacant(k) => {
                        k.insert(hashed.len());
                        hashed.push((i, words, len.div_ceil(CHUNK_LEN)));
                    }
                }
            } else if *want == Want::Bytes && len >= DIRECT_MIN {
                direct.push(i);
            } else {
                copied.push((i, words, len / view.elem_size));
            }
        }
        let mut plan = Plan::default();
        let mut slots = vec![Slot::Bytes(0..0); views.len()];
        for (k, (i, _, _)) in hashed.iter().enumerate() {
            slots[*i] = Slot::Hash(32 * k..32 * (k + 1));
        }
        for (i, k) in shared {
            slots[i] = Slot::Hash(32 * k..32 * (k + 1));
        }
        for i in direct {
            slots[i] = Slot::Direct;
        }
        let mut out_len = 32 * hashed.len();
        if !hashed.is_empty() {
            plan.chunks = Some(plan.pass(&hashed));
            // Node 0.. are the chunks; every level appends its outputs after the last level.
            let mut current: Vec<(u64, u64)> = Vec::with_capacity(hashed.len()); // (first node, count) per view
            let mut next_free = 0;
            for (_, _, chunks) in &hashed {
                current.push((next_free, *chunks));
                next_free += chunks;
            }
            while current.iter().any(|&(_, n)| n > 2) {
                let (mut rows, mut prefix, mut outputs) = (Vec::new(), vec![0], 0);
                for (first, n) in current.iter_mut().filter(|(_, n)| *n > 2) {
                    // Up to `levels` levels, stopping where two nodes remain.
                    let (mut out, mut depth) = (*n, 0);
                    while out > 2 && depth < BLOCK_LEVELS {
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
            let start = plan.table.len();
            plan.table.extend(current.iter().map(|&(first, _)| first));
            plan.roots = start..plan.table.len();
        }
        if !copied.is_empty() {
            plan.copy = Some(plan.pass(&copied));
            let start = plan.table.len();
            for (i, _, elements) in &copied {
                let len = (*elements * views[*i].0.elem_size) as usize;
                plan.table.push(out_len as u64);
                slots[*i] = Slot::Bytes(out_len..out_len + len);
                out_len += len;
            }
            plan.copy_out = start..plan.table.len();
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
    fn pass(&mut self, views: &[(usize, [u64; VIEW_WORDS], u64)]) -> Pass {
        let start = self.table.len();
        for (_, words, _) in views {
            self.table.extend_from_slice(words);
        }
        let table = start..self.table.len();
        let start = self.table.len();
        let mut items = 0;
        self.table.push(0);
        for (_, _, n) in views {
            items += n;
            self.table.push(items);
        }
        Pass { views: table, prefix: start..self.table.len(), count: views.len() as u64, items }
    }
}

/// The kernels' `VIEW_WORDS` words for one view.
fn view_words(view: &View) -> Option<[u64; VIEW_WORDS]> {
    let m = Merged::of(view.dims, view.strides)?;
    let contiguous = m.len == 0 || (m.len == 1 && m.strides[0] == 1);
    let mut words = [0u64; VIEW_WORDS];
    words[0] = view.address;
    words[1] = view.elem_size;
    words[2] = m.len as u64;
    words[3] = contiguous as u64;
    words[4] = view.byte_len();
    words[5..5 + VIEW_DIMS].copy_from_slice(&m.dims);
    words[5 + VIEW_DIMS..5 + 2 * VIEW_DIMS].copy_from_slice(&m.strides);
    Some(words)
}

#[cfg(test)]
mod tests {
    //! The plan run through the device kernels compiled for the host, against the blake3 crate
    //! and a plain row-major read of each view.
    use super::*;
    use kernel_host_check as kernels;

    /// Runs a plan the way `record::device::batch` does, on the host; returns the output buffer.
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
            for (d, s) in view.dims.iter().zip(view.strides).rev() {
                off += (e % d) * s;
                e /= d;
            }
            bytes.extend_from_slice(&memory[base + off * es..base + off * es + es]);
        }
        bytes
    }

    fn view<'a>(memory: &[u8], offset: usize, elem_size: u64, dims: &'a [usize], strides: &'a [usize]) -> View<'a> {
        View { address: memory.as_ptr() as u64 + offset as u64, elem_size, dims, strides }
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
        const LENS: [usize; 10] = [0, 1, 255, 256, 257, 1024, 1025, 4096, 100_000, 700 * 1024 / 4];
        for (es, offset) in [(4u64, 0usize), (4, 4), (2, 2), (1, 1), (8, 8), (4, 12)] {
            for len in &LENS {
                views.push((view(&memory, offset, es, std::slice::from_ref(len), &[1]), Want::Hash));
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
        // Rows long enough that most chunks lie within one (read as contiguous memory) and some
        // straddle two: a broadcast f32 row, a broadcast bf16 row at an odd offset, a window of
        // long rows, and a row that ends inside a chunk's last block.
        views.push((view(&memory, 256, 4, &[3, 20_000], &[0, 1]), Want::Hash));
        views.push((view(&memory, 2, 2, &[4, 3_000], &[0, 1]), Want::Hash));
        views.push((view(&memory, 8, 4, &[5, 2_000], &[2_500, 1]), Want::Hash));
        views.push((view(&memory, 1, 1, &[3, 1_500], &[1_600, 1]), Want::Hash));
        // Short rows, several to a chunk (heads split off by a transpose): 64 f32 rows 96
        // elements apart, whole blocks each, and bf16 rows of 40 elements, whose blocks cross
        // rows, at an aligned and at an odd offset.
        views.push((view(&memory, 0, 4, &[3, 16, 64], &[96 * 16, 96, 1]), Want::Hash));
        views.push((view(&memory, 16, 2, &[50, 40], &[48, 1]), Want::Hash));
        views.push((view(&memory, 2, 2, &[50, 40], &[48, 1]), Want::Hash));
        views.push((view(&memory, 64, 4, &[48, 64], &[1, 48]), Want::Bytes));
        views.push((view(&memory, 16, 8, &[2, 70], &[140, 2]), Want::Bytes));
        views.push((view(&memory, 100, 1, &[1, 1, 5000], &[7, 7, 1]), Want::Bytes));
        // The largest tree, 1,400 chunks (8-byte elements), is 10 levels below its root's two
        // nodes: two launches, of 8 levels and 2.
        {
            let plan = Plan::new(&views).expect("every view fits the kernels");
            assert_eq!(plan.levels.len(), 2, "parent launches of a 1,400-chunk tree");
            let out = run(&plan);
            for (i, ((view, want), slot)) in views.iter().zip(&plan.slots).enumerate() {
                let bytes = row_major(&memory, view);
                match slot {
                    Slot::Hash(r) => {
                        assert_eq!(*want, Want::Hash);
                        assert_eq!(&out[r.clone()], blake3::hash(&bytes).as_bytes(), "view {i}: {view:?}");
                    }
                    Slot::Bytes(r) => assert_eq!(&out[r.clone()], &bytes[..], "view {i}: {view:?}"),
                    Slot::Direct => panic!("view {i} is below DIRECT_MIN and must be gathered"),
                }
            }
        }
    }

    #[test]
    fn a_large_tree_merges_eight_levels_a_launch() {
        // 2^20 chunks (1 GiB): 4,096 blocks merge the first eight levels, 16 the next eight,
        // and one the last three, down to the root's two nodes.
        let memory = [0u8; 16];
        let dims = [1usize << 30];
        let plan = Plan::new(&[(view(&memory, 0, 1, &dims, &[1]), Want::Hash)]).unwrap();
        let outputs: Vec<u64> = plan.levels.iter().map(|level| level.outputs).collect();
        assert_eq!(outputs, [1 << 12, 1 << 4, 2]);
    }

    /// Trees of every size from 3 to 700 chunks at odd offsets, with the views' chunks hashed and
    /// merged as the kernels do: the last group of each level holds from one node to a whole
    /// group, and the smaller trees need fewer levels than a launch merges.
    #[test]
    fn trees_of_every_shape_hash_like_the_reference() {
        let memory: Vec<u8> = (0..800_000u32).map(|i| (i.wrapping_mul(2_246_822_519) >> 7) as u8).collect();
        let lens: Vec<[usize; 1]> = (3..=700usize).map(|chunks| [1024 * chunks - chunks % 5]).collect();
        let views: Vec<_> = lens.iter().map(|len| (view(&memory, 1 + len[0] % 61, 1, len, &[1]), Want::Hash)).collect();
        {
            let plan = Plan::new(&views).expect("every view fits the kernels");
            assert_eq!(plan.levels.len(), 2, "700 chunks are 9 levels below two nodes");
            let out = run(&plan);
            for (i, ((v, _), slot)) in views.iter().zip(&plan.slots).enumerate() {
                let Slot::Hash(r) = slot else { panic!("view {i} is hashed on the device") };
                assert_eq!(&out[r.clone()], blake3::hash(&row_major(&memory, v)).as_bytes(), "{} bytes", v.dims[0]);
            }
        }
    }

    #[test]
    fn views_that_read_the_same_bytes_in_the_same_order_are_hashed_once() {
        let memory: Vec<u8> = (0..65_536u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8).collect();
        let flat = view(&memory, 0, 4, &[4096], &[1]);
        // The same bytes as a [64, 64] matrix (a reshape), and that matrix transposed.
        let matrix = view(&memory, 0, 4, &[64, 64], &[64, 1]);
        let transposed = view(&memory, 0, 4, &[64, 64], &[1, 64]);
        let plan = Plan::new(&[(flat, Want::Hash), (transposed, Want::Hash), (matrix, Want::Hash)]).unwrap();
        assert_eq!(plan.slots, vec![Slot::Hash(0..32), Slot::Hash(32..64), Slot::Hash(0..32)]);
        assert_eq!(plan.chunks.as_ref().map(|c| c.count), Some(2), "two distinct views hashed");
        let out = run(&plan);
        assert_eq!(&out[0..32], blake3::hash(&memory[..16_384]).as_bytes());
        assert_eq!(&out[32..64], blake3::hash(&row_major(&memory, &transposed)).as_bytes());
    }

    #[test]
    fn values_of_direct_min_bytes_or_more_are_read_from_their_own_memory_not_gathered() {
        let memory = vec![3u8; 4 * DIRECT_MIN as usize];
        let n = DIRECT_MIN as usize / 4;
        let (below_dims, at_dims, strided_dims) = ([n - 1], [n], [2, n / 2]);
        let below = view(&memory, 0, 4, &below_dims, &[1]);
        let at = view(&memory, 0, 4, &at_dims, &[1]);
        let strided = view(&memory, 0, 4, &strided_dims, &[1, 2]);
        let plan =
            Plan::new(&[(at, Want::Bytes), (below, Want::Bytes), (strided, Want::Bytes), (at, Want::Hash)]).unwrap();
        let gathered = 4 * (n - 1);
        assert_eq!(plan.slots, vec![Slot::Direct, Slot::Bytes(32..32 + gathered), Slot::Direct, Slot::Hash(0..32)]);
        // The output buffer holds the hash and the one gathered view only.
        assert_eq!(plan.out_len, 32 + gathered);
        assert_eq!(plan.copy.as_ref().map(|c| c.count), Some(1));
    }

    #[test]
    fn only_views_of_more_than_one_chunk_are_hashed_on_the_device() {
        let memory = vec![7u8; 8192];
        let small = view(&memory, 0, 4, &[256], &[1]);
        let large = view(&memory, 0, 4, &[257], &[1]);
        let plan = Plan::new(&[(small, Want::Hash), (large, Want::Hash), (small, Want::Bytes)]).unwrap();
        assert_eq!(plan.slots, vec![Slot::Bytes(32..1056), Slot::Hash(0..32), Slot::Bytes(1056..2080)]);
        assert!(plan.levels.is_empty(), "two chunks go straight to the root");
    }

    #[test]
    fn contiguous_dimensions_merge_and_too_many_dimensions_are_refused() {
        let memory = vec![0u8; 4096];
        let dims = [2, 1, 3, 4];
        let merged = Merged::of(&dims, &contiguous_strides(&dims)).unwrap();
        assert_eq!((merged.len, merged.dims[0], merged.strides[0]), (1, 24, 1));
        let transposed = Merged::of(&[3, 4], &[1, 3]).unwrap();
        assert_eq!((transposed.len, &transposed.dims[..2], &transposed.strides[..2]), (2, &[3, 4][..], &[1, 3][..]));
        // Nine dimensions that do not merge (every stride is three times the next).
        let dims = [2usize; 9];
        let strides: Vec<usize> = (0..9u32).rev().map(|k| 3usize.pow(k)).collect();
        assert!(Plan::new(&[(view(&memory, 0, 1, &dims, &strides), Want::Hash)]).is_none());
        assert!(!fits(&dims, &strides), "the recorder copies such a view before hashing it");
        assert!(fits(&[2, 1, 3, 4], &contiguous_strides(&[2, 1, 3, 4])) && fits(&[3, 4], &[1, 3]));
    }
}
