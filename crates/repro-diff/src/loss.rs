//! Loss curves: each step's recorded loss, from one trace or two side by side. Losses are
//! scalars, stored inline at every step, so a hash-only trace still has its curve.

use repro_trace::{TensorKind, TraceError, TraceReader};
use serde::Serialize;

/// One trace's losses, step by step.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LossCurve {
    /// The trace.
    pub trace: String,
    /// The loss tensor followed (the step's first tensor of kind `loss`).
    pub tensor: Option<String>,
    /// (step, loss); `None` where the step recorded no loss value.
    #[serde(serialize_with = "crate::json_float::points")]
    pub points: Vec<(u64, Option<f64>)>,
}

/// The loss curve of the trace `reader` reads (from its next step on).
pub fn loss_curve(reader: &mut TraceReader) -> Result<LossCurve, TraceError> {
    let trace = reader.dir().display().to_string();
    let mut tensor: Option<String> = None;
    let mut points = Vec::new();
    while let Some(step) = reader.next_step()? {
        let loss = match &tensor {
            Some(name) => step.tensors.iter().find(|t| &t.name == name),
            None => step.tensors.iter().find(|t| t.kind == TensorKind::Loss),
        };
        let value = match loss {
            Some(t) if t.shape.iter().product::<u64>() == 1 => {
                tensor.get_or_insert_with(|| t.name.clone());
                reader.values(&step, t)?.map(|v| {
                    use repro_trace::dtype::Element;
                    repro_trace::for_element!(v.dtype, T => T::load(&v.bytes[..T::SIZE]).value())
                })
            }
            _ => None,
        };
        points.push((step.step, value));
    }
    Ok(LossCurve { trace, tensor, points })
}
