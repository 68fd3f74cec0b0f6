//! Shards (format 1.7): a tensor split across the ranks of a run (an FSDP parameter, its
//! gradient) is recorded by each rank as the block it holds, with the whole tensor's shape and
//! the block's offset in it. This module owns the geometry: whether a block lies in its whole,
//! whether the blocks of every rank tile the whole (cover each element exactly once), and
//! placing a block's values into the whole's.

use crate::schema::{ShardOf, TensorRecord};

/// Checks a record's `shard` against the record: one offset and one whole dimension per
/// dimension of the record's shape, and the block inside the whole. Returns what is wrong.
pub fn check(t: &TensorRecord, shard: &ShardOf) -> Result<(), String> {
    let ndim = t.shape.len();
    if shard.whole.len() != ndim || shard.offset.len() != ndim {
        return Err(format!(
            "its shard has a whole of {} and an offset of {} dimensions for a block of {ndim}",
            shard.whole.len(),
            shard.offset.len()
        ));
    }
    if shard.whole.iter().try_fold(t.dtype.size_in_bytes() as u64, |bytes, &d| bytes.checked_mul(d)).is_none() {
        return Err(format!("its shard's whole {:?} of {} holds more than 2^64 - 1 bytes", shard.whole, t.dtype));
    }
    for (d, ((&size, &at), &whole)) in t.shape.iter().zip(&shard.offset).zip(&shard.whole).enumerate() {
        if at.checked_add(size).is_none_or(|end| end > whole) {
            return Err(format!("its shard reaches past the whole along dimension {d}: {size} from {at} of {whole}"));
        }
    }
    if t.view.is_some() {
        return Err("a view holds no values of its own, so it cannot be a shard".into());
    }
    Ok(())
}

/// `check`, for a record of a stream of `world_size` ranks: in a trace of one device (a world
/// of one) there is no other rank to hold the rest of a tensor, so each shard is its whole.
pub fn check_in_world(t: &TensorRecord, shard: &ShardOf, world_size: u64) -> Result<(), String> {
    check(t, shard)?;
    if world_size == 1 && !is_whole(t, shard) {
        return Err(format!(
            "its shard is a block {:?} at {:?} of a whole {:?}, but a trace of one device has no other rank to \
             hold the rest: its shards must each be their whole",
            t.shape, shard.offset, shard.whole
        ));
    }
    Ok(())
}

/// Whether the block `t` records is all of its whole (a world of one device, or a tensor too
/// small to split).
pub fn is_whole(t: &TensorRecord, shard: &ShardOf) -> bool {
    shard.whole == t.shape && shard.offset.iter().all(|&o| o == 0)
}

/// One rank's block of a tensor: the rank, the block's offset and shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Block {
    /// The rank that holds it.
    pub rank: u64,
    /// Its first index along each dimension of the whole.
    pub offset: Vec<u64>,
    /// Its shape.
    pub shape: Vec<u64>,
}

impl Block {
    /// Its element count (saturating: a block lies in a whole of at most 2^64 bytes).
    fn volume(&self) -> u128 {
        self.shape.iter().fold(1u128, |n, &d| n.saturating_mul(d as u128))
    }

    /// Whether two blocks share an element.
    fn overlaps(&self, other: &Block) -> bool {
        self.volume() > 0
            && other.volume() > 0
            && (0..self.shape.len()).all(|d| {
                let (a0, a1) = (self.offset[d], self.offset[d] + self.shape[d]);
                let (b0, b1) = (other.offset[d], other.offset[d] + other.shape[d]);
                a0 < b1 && b0 < a1
            })
    }
}

/// What keeps `blocks` (each inside `whole`, as `check` ensures) from tiling a tensor of shape
/// `whole`: two that overlap, or elements none covers. `None` when they cover every element
/// exactly once.
pub fn tiling_gap(whole: &[u64], blocks: &[Block]) -> Option<String> {
    for (i, a) in blocks.iter().enumerate() {
        if let Some(b) = blocks[i + 1..].iter().find(|b| a.overlaps(b)) {
            return Some(format!(
                "rank {}'s block {:?} at {:?} and rank {}'s block {:?} at {:?} overlap",
                a.rank, a.shape, a.offset, b.rank, b.shape, b.offset
            ));
        }
    }
    // Disjoint blocks inside the whole tile it exactly when their volumes add up to its own
    // (each volume is at most the whole's, which `check` bounds to 64 bits, so none overflows).
    let Some(total) = whole.iter().try_fold(1u128, |n, &d| n.checked_mul(d as u128)) else {
        return Some(format!("its whole {whole:?} has 2^128 elements or more"));
    };
    let Some(covered) = blocks.iter().try_fold(0u128, |n, b| n.checked_add(b.volume())) else {
        return Some("the blocks' elements overflow a count of 2^128".into());
    };
    (covered != total).then(|| format!("the blocks cover {covered} of its {total} elements"))
}

/// Copies a block's row-major bytes (`elem_size` bytes an element) into the row-major bytes of
/// the whole tensor of shape `whole`, at the block's offset.
pub fn place(whole_bytes: &mut [u8], whole: &[u64], elem_size: usize, block: &Block, block_bytes: &[u8]) {
    let ndim = whole.len();
    if block.volume() == 0 {
        return;
    }
    if ndim == 0 {
        whole_bytes.copy_from_slice(block_bytes);
        return;
    }
    // Element strides of the whole, and the block copied one innermost run at a time.
    let mut strides = vec![1u64; ndim];
    for d in (0..ndim - 1).rev() {
        strides[d] = strides[d + 1] * whole[d + 1];
    }
    let run = block.shape[ndim - 1] as usize * elem_size;
    let mut index = vec![0u64; ndim - 1];
    for chunk in block_bytes.chunks_exact(run) {
        let at: u64 = (0..ndim).map(|d| (block.offset[d] + index.get(d).copied().unwrap_or(0)) * strides[d]).sum();
        let at = at as usize * elem_size;
        whole_bytes[at..at + run].copy_from_slice(chunk);
        for d in (0..ndim - 1).rev() {
            index[d] += 1;
            if index[d] < block.shape[d] {
                break;
            }
            index[d] = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;
    use crate::schema::TensorKind;

    fn block(rank: u64, offset: &[u64], shape: &[u64]) -> Block {
        Block { rank, offset: offset.to_vec(), shape: shape.to_vec() }
    }

    #[test]
    fn rows_split_as_fsdp_splits_them_tile_and_gaps_or_overlaps_are_named() {
        let whole = [5, 3];
        // torch.chunk over 3 ranks: rows 0-1, 2-3, 4 (the last shorter).
        let rows = [block(0, &[0, 0], &[2, 3]), block(1, &[2, 0], &[2, 3]), block(2, &[4, 0], &[1, 3])];
        assert_eq!(tiling_gap(&whole, &rows), None);
        // An empty shard (more ranks than rows) tiles too.
        let mut with_empty = rows.to_vec();
        with_empty.push(block(3, &[5, 0], &[0, 3]));
        assert_eq!(tiling_gap(&whole, &with_empty), None);
        let gap = tiling_gap(&whole, &rows[..2]).unwrap();
        assert!(gap.contains("cover 12 of its 15"), "{gap}");
        let overlap = [block(0, &[0, 0], &[3, 3]), block(1, &[2, 0], &[3, 3])];
        let gap = tiling_gap(&whole, &overlap).unwrap();
        assert!(gap.contains("rank 0's block") && gap.contains("rank 1's block") && gap.contains("overlap"), "{gap}");
        // Empty blocks do not tile a whole whose element count overflows 64 bits.
        let huge = [1u64 << 32; 4];
        let empty = [block(0, &[0, 0, 0, 0], &[0, 0, 0, 0]), block(1, &[0, 0, 0, 0], &[0, 0, 0, 0])];
        let gap = tiling_gap(&huge, &empty).unwrap();
        assert!(gap.contains("2^128 elements or more"), "{gap}");
        // Columns tile as well as rows do.
        assert_eq!(tiling_gap(&whole, &[block(0, &[0, 0], &[5, 1]), block(1, &[0, 1], &[5, 2])]), None);
    }

    #[test]
    fn a_shard_must_lie_in_its_whole_with_one_index_a_dimension() {
        let bytes = [0u8; 24];
        let t = TensorRecord::of_bytes("w", TensorKind::Weight, DType::F32, vec![2, 3], &bytes);
        let shard = |whole: &[u64], offset: &[u64]| ShardOf { whole: whole.to_vec(), offset: offset.to_vec() };
        assert!(check(&t, &shard(&[4, 3], &[2, 0])).is_ok());
        let past = check(&t, &shard(&[4, 3], &[3, 0])).unwrap_err();
        assert!(past.contains("past the whole along dimension 0: 2 from 3 of 4"), "{past}");
        let dims = check(&t, &shard(&[12], &[0])).unwrap_err();
        assert!(dims.contains("1 dimensions for a block of 2"), "{dims}");
        assert!(check(&t, &shard(&[4, 3], &[u64::MAX, 0])).is_err(), "an offset that overflows");
        // A whole of 2^128 elements (2^130 bytes) is refused before any tiling is checked.
        let huge = check(&t, &shard(&[1 << 32, 1 << 32, 1 << 32, 1 << 32], &[0, 0, 0, 0]));
        assert!(huge.is_err(), "{huge:?}");
        let t2 = TensorRecord::of_bytes("w", TensorKind::Weight, DType::F32, vec![2, 3], &bytes);
        let too_many_bytes = check(&t2, &shard(&[1 << 62, 3], &[0, 0])).unwrap_err();
        assert!(too_many_bytes.contains("more than 2^64 - 1 bytes"), "{too_many_bytes}");
    }

    #[test]
    fn blocks_placed_into_their_whole_give_its_row_major_bytes() {
        // A 3 x 4 tensor of bytes 0..12, split into a column block and two row blocks.
        let whole_shape = [3u64, 4];
        let whole: Vec<u8> = (0..12).collect();
        let cut = |b: &Block| -> Vec<u8> {
            let mut out = Vec::new();
            for r in 0..b.shape[0] {
                for c in 0..b.shape[1] {
                    out.push(whole[((b.offset[0] + r) * 4 + b.offset[1] + c) as usize]);
                }
            }
            out
        };
        let blocks = [block(0, &[0, 0], &[3, 1]), block(1, &[0, 1], &[2, 3]), block(2, &[2, 1], &[1, 3])];
        assert_eq!(tiling_gap(&whole_shape, &blocks), None);
        let mut rebuilt = vec![0xffu8; 12];
        for b in &blocks {
            place(&mut rebuilt, &whole_shape, 1, b, &cut(b));
        }
        assert_eq!(rebuilt, whole);
        // Elements of several bytes, and a scalar.
        let mut two = vec![0u8; 8];
        place(&mut two, &[2, 2], 2, &block(0, &[1, 0], &[1, 2]), &[1, 2, 3, 4]);
        assert_eq!(two, [0, 0, 0, 0, 1, 2, 3, 4]);
        let mut scalar = vec![0u8; 4];
        place(&mut scalar, &[], 4, &block(0, &[], &[]), &[9, 8, 7, 6]);
        assert_eq!(scalar, [9, 8, 7, 6]);
    }
}
