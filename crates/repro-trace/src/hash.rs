//! The canonical tensor hash: a BLAKE3 digest that depends on a tensor's dtype, shape and
//! element values, and on nothing else (not its device, strides or memory layout).
//!
//! The encoding is two-level so that the expensive part can run wherever the data lives:
//!
//! ```text
//! data_hash = BLAKE3(elements as contiguous row-major little-endian bytes)     (`blake3`)
//!           | BLAKE3(u64le XXH3-64 of each 1 KiB chunk, the last zero-padded)  (`xxh3-1k`, 2.0)
//! hash      = BLAKE3("repro.tensor.v1" || u8 len(dtype) || dtype name || u64le ndim
//!                    || u64le dim[0] || ... || u64le dim[ndim-1] || data_hash)
//! ```
//!
//! `data_hash` is computed over the element bytes wherever they are (a GPU computes it over
//! device memory) and only 32 bytes need to cross to the host. The outer hash is a few dozen
//! bytes and costs nothing measurable. A trace's header says which data hash its tensors use
//! ([`DataHash`]); `xxh3-1k` runs at about twice BLAKE3's rate on a GPU. `docs/trace-format.md`
//! specifies the same encoding; `fixtures/hash_vectors.json` pins it.

use crate::dtype::DType;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::str::FromStr;
use xxhash_rust::xxh3::xxh3_64;

/// Domain-separation prefix of the outer hash.
pub const DOMAIN: &[u8] = b"repro.tensor.v1";

/// Inputs at least this large are hashed with BLAKE3's multi-threaded tree hashing; below it,
/// handing work to other threads costs more than it saves (and competes with the training
/// step's own threads).
const PARALLEL_THRESHOLD: usize = 1 << 20;

/// How a trace computes its tensors' inner data hash: the header's `data_hash` (format 2.0),
/// `blake3` when absent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize)]
pub enum DataHash {
    /// BLAKE3 of the element bytes (every 1.x trace).
    #[default]
    #[serde(rename = "blake3")]
    Blake3,
    /// BLAKE3 of the XXH3-64 digests (u64 little-endian) of the element bytes' 1024-byte
    /// chunks, the last one zero-padded (section 5.5 of the format).
    #[serde(rename = "xxh3-1k")]
    Xxh3Chunks,
}

impl DataHash {
    /// Every data hash, in the order the format lists them.
    pub const ALL: [DataHash; 2] = [DataHash::Blake3, DataHash::Xxh3Chunks];

    /// The name the header and the command line use.
    pub fn name(self) -> &'static str {
        match self {
            DataHash::Blake3 => "blake3",
            DataHash::Xxh3Chunks => "xxh3-1k",
        }
    }

    /// Whether this is BLAKE3 of the bytes, the default (a header omits the key then).
    pub fn is_blake3(&self) -> bool {
        *self == DataHash::Blake3
    }

    /// The inner data hash of `bytes`.
    pub fn of(self, bytes: &[u8]) -> [u8; 32] {
        let mut hasher = DataHasher::new(self);
        hasher.update(bytes);
        hasher.finalize()
    }

    /// The canonical hash of a tensor given its contiguous little-endian element bytes.
    pub fn tensor_hash(self, dtype: DType, shape: &[u64], bytes: &[u8]) -> TensorHash {
        combine(dtype, shape, &self.of(bytes))
    }
}

impl fmt::Display for DataHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The error for a name that is no data hash.
#[derive(Debug, thiserror::Error)]
#[error("`{0}` is not a data hash (expected blake3 or xxh3-1k)")]
pub struct UnknownDataHash(pub String);

impl FromStr for DataHash {
    type Err = UnknownDataHash;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        DataHash::ALL.into_iter().find(|k| k.name() == s).ok_or_else(|| UnknownDataHash(s.chars().take(80).collect()))
    }
}

/// A data hash fed bytes in pieces of any length: the same digest as [`DataHash::of`] over
/// their concatenation.
pub struct DataHasher {
    /// BLAKE3 of the bytes (`blake3`), or of the chunks' leaves (`xxh3-1k`).
    tree: blake3::Hasher,
    /// `xxh3-1k` only: the bytes of a chunk not yet complete (fewer than `CHUNK_LEN`).
    partial: Option<Vec<u8>>,
}

impl DataHasher {
    /// A hasher of nothing yet.
    pub fn new(kind: DataHash) -> DataHasher {
        let partial = match kind {
            DataHash::Blake3 => None,
            DataHash::Xxh3Chunks => Some(Vec::with_capacity(CHUNK_LEN)),
        };
        DataHasher { tree: blake3::Hasher::new(), partial }
    }

    /// Feeds `bytes`, on several threads where that pays.
    pub fn update(&mut self, mut bytes: &[u8]) {
        let Some(partial) = self.partial.as_mut() else {
            update(&mut self.tree, bytes);
            return;
        };
        if !partial.is_empty() {
            let take = (CHUNK_LEN - partial.len()).min(bytes.len());
            partial.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
            if partial.len() < CHUNK_LEN {
                return;
            }
            self.tree.update(&xxh3_64(partial).to_le_bytes());
            partial.clear();
        }
        let whole = bytes.len() / CHUNK_LEN * CHUNK_LEN;
        self.tree.update(&leaves(&bytes[..whole]));
        partial.extend_from_slice(&bytes[whole..]);
    }

    /// The data hash of everything fed.
    pub fn finalize(mut self) -> [u8; 32] {
        if let Some(partial) = self.partial.as_mut().filter(|p| !p.is_empty()) {
            partial.resize(CHUNK_LEN, 0);
            self.tree.update(&xxh3_64(partial).to_le_bytes());
        }
        *self.tree.finalize().as_bytes()
    }
}

/// The leaves of whole chunks: each one's XXH3-64, little-endian, in order; on several threads
/// where that pays.
fn leaves(whole_chunks: &[u8]) -> Vec<u8> {
    use rayon::prelude::*;
    let leaf = |chunk: &[u8]| xxh3_64(chunk).to_le_bytes();
    let digests: Vec<[u8; 8]> = if whole_chunks.len() >= PARALLEL_THRESHOLD {
        whole_chunks.par_chunks_exact(CHUNK_LEN).map(leaf).collect()
    } else {
        whole_chunks.chunks_exact(CHUNK_LEN).map(leaf).collect()
    };
    digests.concat()
}

/// A 32-byte canonical tensor hash. Written as 64 lowercase hex digits.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TensorHash(pub [u8; 32]);

/// BLAKE3 of the element bytes alone: the inner hash of `blake3` traces.
pub fn data_hash(bytes: &[u8]) -> [u8; 32] {
    let mut hasher = blake3::Hasher::new();
    update(&mut hasher, bytes);
    *hasher.finalize().as_bytes()
}

/// Feeds `bytes` to `hasher`, on several threads where that pays.
pub(crate) fn update(hasher: &mut blake3::Hasher, bytes: &[u8]) {
    if bytes.len() >= PARALLEL_THRESHOLD {
        hasher.update_rayon(bytes);
    } else {
        hasher.update(bytes);
    }
}

/// Combines a dtype, a shape and an inner data hash into the canonical hash.
pub fn combine(dtype: DType, shape: &[u64], data_hash: &[u8; 32]) -> TensorHash {
    let mut hasher = described(DOMAIN, dtype, shape);
    hasher.update(data_hash);
    TensorHash(*hasher.finalize().as_bytes())
}

/// A hasher fed `domain || u8 len(dtype) || dtype name || u64le ndim || u64le dim...`: the start
/// of both the canonical hash and a view's (`crate::view`).
pub(crate) fn described(domain: &[u8], dtype: DType, shape: &[u64]) -> blake3::Hasher {
    let mut hasher = blake3::Hasher::new();
    hasher.update(domain);
    let name = dtype.name().as_bytes();
    hasher.update(&[name.len() as u8]);
    hasher.update(name);
    hasher.update(&(shape.len() as u64).to_le_bytes());
    for dim in shape {
        hasher.update(&dim.to_le_bytes());
    }
    hasher
}

/// The canonical hash of a tensor given its contiguous little-endian element bytes, in a
/// `blake3` trace ([`DataHash::tensor_hash`] for either).
pub fn tensor_hash(dtype: DType, shape: &[u64], bytes: &[u8]) -> TensorHash {
    combine(dtype, shape, &data_hash(bytes))
}

/// Bytes per BLAKE3 chunk: the leaves of its hash tree.
pub const CHUNK_LEN: usize = 1024;

/// A BLAKE3 chaining value: a node of the hash tree.
pub type ChainingValue = [u8; 32];

/// Finishes a BLAKE3 hash from one level of its tree.
///
/// `level` is what merging chunk chaining values pairwise, left to right, a number of times
/// yields, where each pass keeps an odd last node unchanged (level 0 is the chunk values
/// themselves). That is how a device computes most of the tree in parallel; the host merges the
/// rest here. Needs at least two nodes (inputs of one chunk are hashed directly).
pub fn finish_tree(mut level: Vec<ChainingValue>) -> [u8; 32] {
    use blake3::hazmat::{merge_subtrees_non_root, merge_subtrees_root, Mode};
    assert!(level.len() >= 2, "a tree of one chunk has no parents to merge");
    while level.len() > 2 {
        level = level
            .chunks(2)
            .map(|pair| match pair {
                [left, right] => merge_subtrees_non_root(left, right, Mode::Hash),
                [single] => *single,
                _ => unreachable!("chunks(2) yields one or two nodes"),
            })
            .collect();
    }
    *merge_subtrees_root(&level[0], &level[1], Mode::Hash).as_bytes()
}

/// The chaining value of chunk `index`, computed on the host (the reference for device code).
pub fn chunk_chaining_value(chunk: &[u8], index: u64) -> ChainingValue {
    use blake3::hazmat::HasherExt;
    let mut hasher = blake3::Hasher::new();
    hasher.set_input_offset(index * CHUNK_LEN as u64);
    hasher.update(chunk);
    hasher.finalize_non_root()
}

impl fmt::Display for TensorHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for TensorHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TensorHash({self})")
    }
}

/// The error for a string that is not 64 lowercase hex digits.
#[derive(Debug, thiserror::Error)]
#[error("`{0}` is not a tensor hash (expected 64 lowercase hex digits)")]
pub struct BadHash(pub String);

impl FromStr for TensorHash {
    type Err = BadHash;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        // One pass, digit by digit: a diff parses a hash for every tensor it reads.
        let digit = |b: u8| match b {
            b'0'..=b'9' => Some(b - b'0'),
            b'a'..=b'f' => Some(b - b'a' + 10),
            _ => None,
        };
        let bad = || BadHash(s.chars().take(80).collect());
        let digits = s.as_bytes();
        if digits.len() != 64 {
            return Err(bad());
        }
        let mut out = [0u8; 32];
        for (byte, pair) in out.iter_mut().zip(digits.chunks_exact(2)) {
            *byte = (digit(pair[0]).ok_or_else(bad)? << 4) | digit(pair[1]).ok_or_else(bad)?;
        }
        Ok(TensorHash(out))
    }
}

impl Serialize for TensorHash {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for TensorHash {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_depends_on_dtype_shape_and_order() {
        let bytes: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0].iter().flat_map(|x| x.to_le_bytes()).collect();
        let base = tensor_hash(DType::F32, &[4], &bytes);
        assert_ne!(base, tensor_hash(DType::F32, &[2, 2], &bytes));
        assert_ne!(base, tensor_hash(DType::U32, &[4], &bytes));
        let mut swapped = bytes.clone();
        swapped[..4].copy_from_slice(&2.0f32.to_le_bytes());
        swapped[4..8].copy_from_slice(&1.0f32.to_le_bytes());
        assert_ne!(base, tensor_hash(DType::F32, &[4], &swapped));
        assert_eq!(base, tensor_hash(DType::F32, &[4], &bytes));
    }

    /// Section 5.5's definition, written out the plain way: each chunk padded, its XXH3-64
    /// little-endian, BLAKE3 over them all.
    fn xxh3_1k_by_the_spec(bytes: &[u8]) -> [u8; 32] {
        let mut leaves = Vec::new();
        for chunk in bytes.chunks(1024) {
            let mut padded = chunk.to_vec();
            padded.resize(1024, 0);
            leaves.extend_from_slice(&xxhash_rust::xxh3::xxh3_64(&padded).to_le_bytes());
        }
        *blake3::hash(&leaves).as_bytes()
    }

    #[test]
    fn xxh3_1k_is_the_specs_two_levels_whatever_the_pieces_fed() {
        // Around a chunk, a parallel-hashing threshold, and a tail of every length class.
        for len in [0usize, 1, 17, 1023, 1024, 1025, 3000, PARALLEL_THRESHOLD - 1, PARALLEL_THRESHOLD * 2 + 513] {
            let bytes: Vec<u8> = (0..len).map(|i| (i * 131 + 11) as u8).collect();
            let expected = xxh3_1k_by_the_spec(&bytes);
            assert_eq!(DataHash::Xxh3Chunks.of(&bytes), expected, "{len} bytes at once");
            for piece in [1usize, 7, 1000, 1024, 4096 + 3] {
                let mut hasher = DataHasher::new(DataHash::Xxh3Chunks);
                for p in bytes.chunks(piece) {
                    hasher.update(p);
                }
                assert_eq!(hasher.finalize(), expected, "{len} bytes in pieces of {piece}");
            }
        }
        assert_eq!(DataHash::Xxh3Chunks.of(&[]), *blake3::hash(&[]).as_bytes(), "no chunks: BLAKE3 of nothing");
    }

    #[test]
    fn the_specs_xxh3_1k_vectors_hold() {
        // docs/trace-format.md, section 5.5 (computed there with Python's `xxhash` and `blake3`).
        let hex = |b: &[u8; 32]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
        let floats: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0].iter().flat_map(|x| x.to_le_bytes()).collect();
        let pattern: Vec<u8> = (0..1025usize).map(|i| ((i * 31 + 7) % 251) as u8).collect();
        for (dtype, shape, bytes, data_hash, hash) in [
            (
                DType::F32,
                vec![2u64, 2],
                floats,
                "bbf3e17faedadc2a601852907215599f583fdb9794990eecca7fbaa14922ee20",
                "799481f513eaab7851ddccae48492b6a110673f7ca07de28d6a7d1d77ef9b245",
            ),
            (
                DType::U8,
                vec![1025],
                pattern,
                "d2710905bd4c9a7a0e23395de47ef876e3ebb9e5acb9033ebaac82c5f0a01408",
                "bc72ef7972dc14f94dfb0c2cdda9ac4a15cc27e4edaab30febd3a54c61c25b57",
            ),
        ] {
            assert_eq!(hex(&DataHash::Xxh3Chunks.of(&bytes)), data_hash, "{dtype:?} {shape:?}");
            assert_eq!(
                DataHash::Xxh3Chunks.tensor_hash(dtype, &shape, &bytes).to_string(),
                hash,
                "{dtype:?} {shape:?}"
            );
        }
    }

    #[test]
    fn the_two_data_hashes_differ_and_each_sees_a_flipped_bit_anywhere() {
        let bytes: Vec<u8> = (0..5000).map(|i| (i * 7) as u8).collect();
        let (b3, xx) = (DataHash::Blake3.of(&bytes), DataHash::Xxh3Chunks.of(&bytes));
        assert_ne!(b3, xx);
        for at in [0usize, 1023, 1024, 4999] {
            let mut flipped = bytes.clone();
            flipped[at] ^= 0x01;
            assert_ne!(DataHash::Blake3.of(&flipped), b3, "blake3, byte {at}");
            assert_ne!(DataHash::Xxh3Chunks.of(&flipped), xx, "xxh3-1k, byte {at}");
        }
        // A trailing zero byte is padding to the leaves, not to the outer hash.
        let (short, long) = (&bytes[..4999], [&bytes[..4999], &[0u8]].concat());
        assert_eq!(DataHash::Xxh3Chunks.of(short), DataHash::Xxh3Chunks.of(&long));
        assert_ne!(
            DataHash::Xxh3Chunks.tensor_hash(DType::U8, &[4999], short),
            DataHash::Xxh3Chunks.tensor_hash(DType::U8, &[5000], &long)
        );
    }

    #[test]
    fn data_hashes_read_and_print_by_their_names() {
        for kind in DataHash::ALL {
            assert_eq!(kind.name().parse::<DataHash>().unwrap(), kind);
            assert_eq!(serde_json::to_string(&kind).unwrap(), format!("\"{}\"", kind.name()));
        }
        let err = "xxh3".parse::<DataHash>().unwrap_err().to_string();
        assert!(err.contains("`xxh3` is not a data hash") && err.contains("xxh3-1k"), "{err}");
    }

    #[test]
    fn parallel_and_serial_paths_agree() {
        let bytes: Vec<u8> = (0..PARALLEL_THRESHOLD * 3 + 17).map(|i| (i * 31) as u8).collect();
        let serial = *blake3::hash(&bytes).as_bytes();
        assert_eq!(data_hash(&bytes), serial);
    }

    #[test]
    fn tree_of_chunk_values_matches_blake3_at_every_level() {
        for len in [1025usize, 2048, 2049, 5 * 1024 + 3, 7 * 1024, 64 * 1024 + 1, 1 << 20] {
            let bytes: Vec<u8> = (0..len).map(|i| (i * 131 + 11) as u8).collect();
            let mut level: Vec<ChainingValue> =
                bytes.chunks(CHUNK_LEN).enumerate().map(|(i, c)| chunk_chaining_value(c, i as u64)).collect();
            let expected = *blake3::hash(&bytes).as_bytes();
            // Finishing from any level of the pairwise merge gives the same root.
            while level.len() >= 2 {
                assert_eq!(finish_tree(level.clone()), expected, "len {len}, level of {}", level.len());
                level = level
                    .chunks(2)
                    .map(|p| {
                        if p.len() == 2 {
                            blake3::hazmat::merge_subtrees_non_root(&p[0], &p[1], blake3::hazmat::Mode::Hash)
                        } else {
                            p[0]
                        }
                    })
                    .collect();
            }
        }
    }

    #[test]
    fn hex_round_trip_and_rejects_garbage() {
        let h = tensor_hash(DType::U8, &[0], &[]);
        assert_eq!(h.to_string().parse::<TensorHash>().unwrap(), h);
        assert!("xyz".parse::<TensorHash>().is_err());
        assert!(h.to_string().to_uppercase().parse::<TensorHash>().is_err());
        assert!(format!("+a{}", &h.to_string()[2..]).parse::<TensorHash>().is_err());
        assert!("é".repeat(32).parse::<TensorHash>().is_err());
    }
}
