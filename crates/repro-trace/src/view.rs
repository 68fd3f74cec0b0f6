//! Views (format 1.5): a captured graph's node that reads the memory of an earlier tensor of its
//! step, through a layout of its own (a transpose, a broadcast, a narrow, a reshape), is recorded
//! by that relation rather than by its bytes. Its values follow from the earlier tensor's and
//! the layout, so its hash is derived from the earlier tensor's hash and the layout: equal in two
//! runs exactly when the earlier tensor's hash and the layout are. The device then hashes each
//! storage once, not once per view of it.
//!
//! ```text
//! hash = BLAKE3("repro.view.v1" || u8 len(dtype) || dtype name || u64le ndim || u64le dim[i]...
//!               || hash of `of` (32 bytes) || u64le offset || u64le stride[i]...)
//! ```

use crate::dtype::DType;
use crate::hash::TensorHash;
use crate::schema::{TensorRecord, ViewOf};

/// Domain-separation prefix of a view's hash.
pub const VIEW_DOMAIN: &[u8] = b"repro.view.v1";

/// The hash of a view of dtype `dtype` and shape `shape` that reads the tensor of hash `of`
/// at `offset` through `strides`.
pub fn view_hash(dtype: DType, shape: &[u64], of: &TensorHash, offset: u64, strides: &[u64]) -> TensorHash {
    let mut hasher = crate::hash::described(VIEW_DOMAIN, dtype, shape);
    hasher.update(&of.0);
    hasher.update(&offset.to_le_bytes());
    for stride in strides {
        hasher.update(&stride.to_le_bytes());
    }
    TensorHash(*hasher.finalize().as_bytes())
}

/// Whether a view of `shape` read at `offset` through `strides` stays within `elements`
/// elements: its last element's index is below it (an empty view reads nothing).
pub fn within(shape: &[u64], offset: u64, strides: &[u64], elements: u64) -> bool {
    if shape.contains(&0) {
        return true;
    }
    let last = shape.iter().zip(strides).try_fold(offset, |acc, (&d, &s)| (d - 1).checked_mul(s)?.checked_add(acc));
    last.is_some_and(|last| last < elements)
}

/// The row-major bytes of a view of `shape` read at `offset` through `strides` from `owner`'s
/// contiguous elements of `elem_size` bytes each. The layout must lie within them (`within`).
pub fn gather(owner: &[u8], elem_size: usize, shape: &[u64], offset: u64, strides: &[u64]) -> Vec<u8> {
    let count: u64 = shape.iter().product();
    let mut bytes = Vec::with_capacity(count as usize * elem_size);
    let mut index = vec![0u64; shape.len()];
    for _ in 0..count {
        let at = offset + index.iter().zip(strides).map(|(i, s)| i * s).sum::<u64>();
        let at = at as usize * elem_size;
        bytes.extend_from_slice(&owner[at..at + elem_size]);
        // The next index in row-major order.
        for d in (0..shape.len()).rev() {
            index[d] += 1;
            if index[d] < shape[d] {
                break;
            }
            index[d] = 0;
        }
    }
    bytes
}

/// Checks a view record against the tensor it names (`owner`, recorded earlier in the step, if
/// any): one stride per dimension, an owner that is not itself a view and has the view's dtype,
/// a layout within the owner's elements, no values of its own, and the derived hash. The reason
/// when it fails.
pub fn check(t: &TensorRecord, view: &ViewOf, owner: Option<&TensorRecord>) -> Result<(), String> {
    if view.strides.len() != t.shape.len() {
        return Err(format!("its view has {} strides for {} dimensions", view.strides.len(), t.shape.len()));
    }
    let Some(owner) = owner else {
        return Err(format!("it is a view of `{}`, which is not recorded earlier in the step", view.of));
    };
    if owner.view.is_some() {
        return Err(format!("it is a view of `{}`, itself a view", view.of));
    }
    if owner.dtype != t.dtype {
        return Err(format!("it is a {} view of `{}`, which is {}", t.dtype, view.of, owner.dtype));
    }
    let elements = owner.shape.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d)).unwrap_or(u64::MAX);
    if !within(&t.shape, view.offset, &view.strides, elements) {
        return Err(format!("its view reads past the {elements} elements of `{}`", view.of));
    }
    if t.inline.is_some() || t.in_payload {
        return Err("a view stores no values of its own (they are its owner's)".into());
    }
    if t.hash != view_hash(t.dtype, &t.shape, &owner.hash, view.offset, &view.strides) {
        return Err(format!("its hash is not the hash of its view of `{}`", view.of));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::TensorKind;

    fn owner() -> TensorRecord {
        TensorRecord::of_bytes("w", TensorKind::Weight, DType::F32, vec![3, 4], &[7; 48])
    }

    /// The transpose of a [3, 4] matrix: element (i, j) is the owner's element j * 4 + i.
    fn transposed(owner: &TensorRecord) -> TensorRecord {
        let view = ViewOf { of: "w".into(), offset: 0, strides: vec![1, 4] };
        TensorRecord {
            hash: view_hash(DType::F32, &[4, 3], &owner.hash, 0, &view.strides),
            view: Some(view),
            ..TensorRecord::of_bytes("w.t", TensorKind::OpOutput, DType::F32, vec![4, 3], &[0; 48])
        }
    }

    /// The spec's test vectors (docs/trace-format.md, section 5.4): the transpose, and the
    /// second column, of the F32 [2, 2] tensor [1, 2, 3, 4] of section 5.3.
    #[test]
    fn the_specs_view_hash_vectors_hold() {
        let values: Vec<u8> = [1f32, 2.0, 3.0, 4.0].iter().flat_map(|v| v.to_le_bytes()).collect();
        let owner = crate::hash::tensor_hash(DType::F32, &[2, 2], &values);
        assert_eq!(owner.to_string(), "7ce30fc38aeee83917b0b5b059ca18ac286f78859e8e0c0319962c115c6c42ca");
        let transposed = view_hash(DType::F32, &[2, 2], &owner, 0, &[1, 2]);
        assert_eq!(transposed.to_string(), "1191e5fe029bf1fe9945482fa478d35a78d79af94bc3349b00311bc9af6800bc");
        let column = view_hash(DType::F32, &[2], &owner, 1, &[2]);
        assert_eq!(column.to_string(), "eb3a285a57ac1f526d3eafd6fd5216638bf1a24f709e5fde1cebe680d5d7f32b");
    }

    #[test]
    fn a_views_hash_follows_its_owners_hash_and_layout_and_nothing_else() {
        let w = owner();
        let h = |of: &TensorHash, offset, strides: &[u64]| view_hash(DType::F32, &[4, 3], of, offset, strides);
        let base = h(&w.hash, 0, &[1, 4]);
        assert_eq!(base, h(&w.hash, 0, &[1, 4]));
        let other = TensorRecord::of_bytes("w", TensorKind::Weight, DType::F32, vec![3, 4], &[8; 48]);
        assert_ne!(base, h(&other.hash, 0, &[1, 4]), "another owner");
        assert_ne!(base, h(&w.hash, 1, &[1, 4]), "another offset");
        assert_ne!(base, h(&w.hash, 0, &[0, 4]), "other strides");
        assert_ne!(base, view_hash(DType::F32, &[3, 4], &w.hash, 0, &[1, 4]), "another shape");
        assert_ne!(base, view_hash(DType::I32, &[4, 3], &w.hash, 0, &[1, 4]), "another dtype");
        assert_ne!(base, w.hash, "not the owner's own hash");
    }

    #[test]
    fn a_view_is_checked_against_its_owner() {
        let w = owner();
        let t = transposed(&w);
        let view = t.view.clone().unwrap();
        assert_eq!(check(&t, &view, Some(&w)), Ok(()));
        let refused =
            |t: &TensorRecord, view: &ViewOf, owner: Option<&TensorRecord>| check(t, view, owner).unwrap_err();
        assert!(refused(&t, &view, None).contains("not recorded earlier"));
        let as_view = TensorRecord { view: Some(view.clone()), ..w.clone() };
        assert!(refused(&t, &view, Some(&as_view)).contains("itself a view"));
        let ints = TensorRecord { dtype: DType::I32, ..w.clone() };
        assert!(refused(&t, &view, Some(&ints)).contains("which is I32"));
        let past = ViewOf { offset: 1, ..view.clone() };
        assert!(refused(&t, &past, Some(&w)).contains("reads past the 12 elements"));
        let short = ViewOf { strides: vec![1], ..view.clone() };
        assert!(refused(&t, &short, Some(&w)).contains("1 strides for 2 dimensions"));
        let valued = TensorRecord { inline: Some(vec![0; 48]), ..t.clone() };
        assert!(refused(&valued, &view, Some(&w)).contains("no values of its own"));
        let forged = TensorRecord { hash: w.hash, ..t.clone() };
        assert!(refused(&forged, &view, Some(&w)).contains("hash is not the hash of its view"));
    }

    #[test]
    fn a_view_gathers_its_owners_elements_through_its_layout() {
        let owner: Vec<u8> = (0..12u8).collect(); // a [3, 4] matrix of bytes
        assert_eq!(gather(&owner, 1, &[4, 3], 0, &[1, 4]), [0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11], "transposed");
        assert_eq!(gather(&owner, 1, &[2, 3], 5, &[0, 1]), [5, 6, 7, 5, 6, 7], "a broadcast row");
        assert_eq!(gather(&owner, 2, &[2], 1, &[3]), [2, 3, 8, 9], "two-byte elements");
        assert!(gather(&owner, 1, &[0, 3], 0, &[3, 1]).is_empty());
        assert_eq!(gather(&owner, 4, &[], 2, &[]), [8, 9, 10, 11], "a scalar");
    }

    #[test]
    fn a_layout_is_within_its_owner_up_to_its_last_element() {
        assert!(within(&[4, 3], 0, &[1, 4], 12));
        assert!(!within(&[4, 3], 0, &[1, 4], 11));
        assert!(within(&[2, 5, 4], 8, &[0, 0, 1], 12), "a broadcast row");
        assert!(!within(&[2, 5, 4], 9, &[0, 0, 1], 12));
        assert!(within(&[0, 3], 99, &[1, 4], 12), "an empty view reads nothing");
        assert!(!within(&[2], u64::MAX, &[1], u64::MAX), "no overflow");
        assert!(!within(&[3], 0, &[u64::MAX], u64::MAX));
    }
}
