//! Completing a finished step's records from its device results: the hashes and values that
//! came back, put in their records, and how many bytes of full values that will store (known
//! before, for a progress display).

use super::error::RecordError;
use super::tensor_bytes::DeviceResult;
use crate::hash::{combine, tensor_hash, TensorHash};
use crate::trace::view::view_hash;
use crate::trace::{Payload, StepTensor};
use std::collections::BTreeMap;

/// Puts a finished step's device results (in ticket order) into its records: `deferred` pairs
/// a record's index with its ticket. `streamed` holds the data hashes of the values written to
/// the step's payload file as they came (`payload_stream`), by where each starts in its data.
pub(crate) fn fill_records(
    mut tensors: Vec<StepTensor>,
    deferred: Vec<(usize, usize)>,
    mut results: Vec<DeviceResult>,
    full: bool,
    inline_max: u64,
    streamed: Option<&BTreeMap<u64, [u8; 32]>>,
) -> Result<Vec<StepTensor>, RecordError> {
    for (index, ticket) in deferred {
        let t = &mut tensors[index];
        let r = &mut t.record;
        // Each ticket is read once: its bytes move into the record, uncopied.
        match std::mem::replace(&mut results[ticket], DeviceResult::Bytes(Vec::new())) {
            DeviceResult::DataHash(h) => r.hash = combine(r.dtype, &r.shape, &h),
            DeviceResult::Bytes(bytes) => {
                r.hash = tensor_hash(r.dtype, &r.shape, &bytes);
                if bytes.len() as u64 <= inline_max {
                    r.inline = Some(bytes);
                } else if full {
                    t.payload = Some(Payload::Bytes(bytes));
                }
            }
            DeviceResult::InFile(data) => {
                let Some(h) = streamed.and_then(|hashes| hashes.get(&data.start)) else {
                    return Err(RecordError::Unsupported(format!(
                        "tensor `{}`: its values went to the payload file, which has no hash for them",
                        r.name
                    )));
                };
                r.hash = combine(r.dtype, &r.shape, h);
                t.payload = Some(Payload::InFile(data));
            }
        }
    }
    derive_view_hashes(&mut tensors);
    Ok(tensors)
}

/// Gives each view (`TensorRecord::view`) the hash derived from its owner's, now that every
/// hash of the step is known. A view whose owner is missing keeps a zero hash, which the trace
/// writer refuses, naming it.
fn derive_view_hashes(tensors: &mut [StepTensor]) {
    if tensors.iter().all(|t| t.record.view.is_none()) {
        return;
    }
    let mut owners: BTreeMap<String, TensorHash> = BTreeMap::new();
    for t in tensors {
        let r = &mut t.record;
        match &r.view {
            Some(view) => {
                if let Some(owner) = owners.get(&view.of) {
                    r.hash = view_hash(r.dtype, &r.shape, owner, view.offset, &view.strides);
                }
            }
            None => {
                owners.insert(r.name.clone(), r.hash);
            }
        }
    }
}

/// Bytes of full values a step stores once `fill_records` has run: the payloads it has, and
/// the values of every record waiting for device results that will be stored (a step storing
/// full values reads them all back; those within `inline_max` are kept inline instead).
pub(crate) fn payload_bytes(tensors: &[StepTensor], deferred: &[(usize, usize)], full: bool, inline_max: u64) -> u64 {
    let stored: u64 = tensors.iter().filter_map(|t| t.payload.as_ref()).map(Payload::len).sum();
    let coming: u64 = deferred
        .iter()
        .map(|&(index, _)| {
            let r = &tensors[index].record;
            r.shape.iter().product::<u64>() * r.dtype.size_in_bytes() as u64
        })
        .filter(|&bytes| full && bytes > inline_max)
        .sum();
    stored + coming
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::TensorKind;

    /// The progress display learns a step's stored bytes before the writer thread fills its
    /// records in: the count made before must be what the fill stores.
    #[test]
    fn the_payload_counted_before_the_fill_is_the_payload_it_stores() {
        use crate::trace::{dtype::DType, TensorRecord};
        let record = |elements: u64| StepTensor {
            record: TensorRecord::of_bytes(
                format!("t{elements}"),
                TensorKind::OpOutput,
                DType::F32,
                vec![elements],
                &vec![0; 4 * elements as usize],
            ),
            payload: None,
        };
        let sizes = [100u64, 128, 129, 300, 5000];
        for full in [false, true] {
            let tensors: Vec<StepTensor> = sizes.iter().map(|&n| record(n)).collect();
            let deferred: Vec<(usize, usize)> = (0..sizes.len()).map(|i| (i, i)).collect();
            // What a device read gives: values where the host keeps them, a hash otherwise.
            let results = sizes
                .iter()
                .map(|&n| {
                    let bytes = n as usize * 4;
                    if full || bytes <= 512 {
                        DeviceResult::Bytes(vec![0; bytes])
                    } else {
                        DeviceResult::DataHash([0; 32])
                    }
                })
                .collect();
            let counted = payload_bytes(&tensors, &deferred, full, 512);
            let filled = fill_records(tensors, deferred, results, full, 512, None).unwrap();
            let stored: u64 = filled.iter().filter_map(|t| t.payload.as_ref()).map(Payload::len).sum();
            assert_eq!(counted, stored, "full: {full}");
            assert_eq!(stored, if full { (129 + 300 + 5000) * 4 } else { 0 });
        }
    }
}
