//! The determinism gate's verdict: several comparisons against one reference run, and, when the
//! reference was recorded elsewhere, what in the environment most likely explains a failure.

use super::traces::{FieldDifference, TraceDiff};
use serde::Serialize;

/// The outcome of a gate.
#[derive(Debug, Clone, Serialize)]
pub struct GateReport {
    /// What was gated (workload and settings, or the command).
    pub subject: String,
    /// The reference: `run 0` or the baseline file.
    pub reference: String,
    /// One comparison per run against the reference, with its label.
    pub comparisons: Vec<(String, TraceDiff)>,
    /// Environment differences that most likely explain a failure, most likely first.
    pub likely_causes: Vec<String>,
}

impl GateReport {
    /// True when every run is bit-identical to the reference.
    pub fn passed(&self) -> bool {
        self.comparisons.iter().all(|(_, d)| d.is_identical())
    }
}

/// Names, from environment differences, the likely causes of a divergence, most likely first.
pub fn likely_causes(env: &[FieldDifference]) -> Vec<String> {
    let show = |v: &Option<String>| v.clone().unwrap_or_else(|| "(unset)".into());
    let mut causes: Vec<(u8, String)> = env
        .iter()
        .map(|d| {
            let (a, b) = (show(&d.a), show(&d.b));
            let (rank, text) = match d.field.as_str() {
                "device" => (0, format!("another device ({a} vs {b}): kernels sum in other orders")),
                "device_name" => (1, format!("another device model ({a} vs {b}): libraries pick other kernels")),
                "cpu_model" => (2, format!("another CPU ({a} vs {b}): CPU matrix kernels are chosen per CPU")),
                "candle_version" => (3, format!("candle {a} vs {b}: kernels may have changed")),
                "threads" => (4, format!("{a} vs {b} worker threads")),
                "repro_version" => (5, format!("repro {a} vs {b}: built-in workloads may have changed")),
                "rustc" => (6, format!("another compiler ({a} vs {b}): code generation may differ")),
                field => match field.strip_prefix("env.") {
                    Some(var) => (4, format!("{var}={a} vs {b}: this variable changes numerics")),
                    None => (7, format!("{field}: {a} vs {b}")),
                },
            };
            (rank, text)
        })
        .collect();
    causes.sort_by_key(|(rank, _)| *rank);
    causes.into_iter().map(|(_, text)| text).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(name: &str, a: &str, b: &str) -> FieldDifference {
        FieldDifference { field: name.into(), a: Some(a.into()), b: Some(b.into()) }
    }

    #[test]
    fn device_changes_rank_before_threads_and_variables() {
        let causes = likely_causes(&[
            field("threads", "2", "16"),
            field("env.CUBLAS_WORKSPACE_CONFIG", ":4096:8", ":16:8"),
            field("device_name", "NVIDIA H100 80GB HBM3", "NVIDIA H200"),
        ]);
        assert!(causes[0].starts_with("another device model"), "{causes:?}");
        assert_eq!(causes.len(), 3);
        assert!(causes.iter().any(|c| c.starts_with("CUBLAS_WORKSPACE_CONFIG=:4096:8")));
    }
}
