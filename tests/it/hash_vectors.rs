//! `fixtures/hash_vectors.json` pins the canonical hash. Each vector names a dtype, a shape and
//! a byte pattern; this test recomputes every hash and fails if any differs (the encoding
//! changed, or the file went stale). `REPRO_BLESS=1` rewrites the file after a deliberate change.
//! `vectors` are the hashes of `blake3` traces, `xxh3_1k` those of `xxh3-1k` traces (format 2.0).

use repro::dtype::DType;
use repro::hash::DataHash;
use serde_json::{json, Value};

const PATH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/hash_vectors.json");

/// Byte `i` of every vector's data: a fixed pattern anyone can regenerate.
fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| ((i * 31 + 7) % 251) as u8).collect()
}

fn cases() -> Vec<(DType, Vec<u64>)> {
    let mut cases = Vec::new();
    for d in DType::ALL {
        for shape in [vec![], vec![0], vec![1], vec![3], vec![2, 3], vec![4, 0, 2]] {
            cases.push((d, shape));
        }
    }
    // Around BLAKE3's 1024-byte chunk and the parallel-hashing threshold (128 KiB).
    for n in [1023u64, 1024, 1025, 2048, 3073, 131_071, 131_072, 131_073, 1 << 20] {
        cases.push((DType::U8, vec![n]));
    }
    cases.push((DType::F32, vec![256]));
    cases.push((DType::F32, vec![32, 33]));
    cases.push((DType::BF16, vec![513]));
    cases
}

fn vectors(kind: DataHash) -> Vec<Value> {
    cases()
        .into_iter()
        .map(|(dtype, shape)| {
            let len = shape.iter().product::<u64>() as usize * dtype.size_in_bytes();
            let hash = kind.tensor_hash(dtype, &shape, &pattern(len)).to_string();
            json!({"dtype": dtype.name(), "shape": shape, "hash": hash})
        })
        .collect()
}

fn compute() -> Value {
    json!({
        "about": "Canonical tensor hashes (docs/trace-format.md): `vectors` with the data hash blake3, `xxh3_1k` with xxh3-1k. Data byte i = (i*31 + 7) mod 251, for numel*size bytes.",
        "vectors": vectors(DataHash::Blake3),
        "xxh3_1k": vectors(DataHash::Xxh3Chunks),
    })
}

#[test]
fn checked_in_hash_vectors_are_current() {
    let fresh = compute();
    if std::env::var_os("REPRO_BLESS").is_some() {
        std::fs::write(PATH, serde_json::to_string_pretty(&fresh).unwrap() + "\n").unwrap();
    }
    let text = std::fs::read_to_string(PATH).expect("fixtures/hash_vectors.json exists (REPRO_BLESS=1 writes it)");
    let stored: Value = serde_json::from_str(&text).unwrap();
    for key in ["vectors", "xxh3_1k"] {
        let (stored, fresh) = (stored[key].as_array().expect(key), fresh[key].as_array().unwrap());
        assert_eq!(stored.len(), fresh.len(), "{key}: vector count changed");
        for (s, f) in stored.iter().zip(fresh) {
            assert_eq!(s, f, "{key}: hash vector changed");
        }
    }
}
