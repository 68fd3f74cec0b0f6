//! The built-in workloads by name: what `--workload` takes and a trace's `run.workload` says,
//! as one type that every dispatch matches on (a new workload is a new arm the compiler asks
//! for wherever workloads are told apart).

use super::classifier::ModelKind;
use std::fmt;
use std::str::FromStr;

/// A built-in workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum WorkloadKind {
    /// The linear adder.
    Adder,
    /// The MLP classifier.
    Mlp,
    /// The CNN classifier.
    Cnn,
    /// ResNet-18.
    ResNet18,
    /// The byte-level transformer.
    Gpt,
    /// candle-transformers' Qwen2, at inference.
    Qwen2,
    /// candle-transformers' Gemma, at inference.
    Gemma,
}

impl WorkloadKind {
    /// Every workload, in the order help texts list them.
    pub const ALL: [WorkloadKind; 7] = [
        WorkloadKind::Adder,
        WorkloadKind::Mlp,
        WorkloadKind::Cnn,
        WorkloadKind::ResNet18,
        WorkloadKind::Gpt,
        WorkloadKind::Qwen2,
        WorkloadKind::Gemma,
    ];

    /// The workload's name (`--workload`, `run.workload`).
    pub fn name(self) -> &'static str {
        match self {
            WorkloadKind::Adder => "adder",
            WorkloadKind::Mlp => "mlp",
            WorkloadKind::Cnn => "cnn",
            WorkloadKind::ResNet18 => "resnet18",
            WorkloadKind::Gpt => "gpt",
            WorkloadKind::Qwen2 => "qwen2",
            WorkloadKind::Gemma => "gemma",
        }
    }

    /// Every workload's name, in `ALL`'s order.
    pub fn names() -> [&'static str; 7] {
        Self::ALL.map(Self::name)
    }

    /// The classifier workload of `model`.
    pub fn from_classifier(model: ModelKind) -> Self {
        match model {
            ModelKind::Mlp => WorkloadKind::Mlp,
            ModelKind::Cnn => WorkloadKind::Cnn,
            ModelKind::ResNet18 => WorkloadKind::ResNet18,
        }
    }

    /// The classifier architecture, for the classifier workloads.
    pub fn classifier_model(self) -> Option<ModelKind> {
        match self {
            WorkloadKind::Mlp => Some(ModelKind::Mlp),
            WorkloadKind::Cnn => Some(ModelKind::Cnn),
            WorkloadKind::ResNet18 => Some(ModelKind::ResNet18),
            WorkloadKind::Adder | WorkloadKind::Gpt | WorkloadKind::Qwen2 | WorkloadKind::Gemma => None,
        }
    }
}

impl fmt::Display for WorkloadKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for WorkloadKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| format!("unknown workload `{s}`: expected one of {}", Self::names().join(", ")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_classifiers_name_their_model() {
        for kind in WorkloadKind::ALL {
            assert_eq!(kind.name().parse::<WorkloadKind>(), Ok(kind));
            if let Some(model) = kind.classifier_model() {
                assert_eq!(model.workload_name(), kind.name());
            }
        }
        assert!("bert".parse::<WorkloadKind>().unwrap_err().contains("adder, mlp"));
        for model in [ModelKind::Mlp, ModelKind::Cnn, ModelKind::ResNet18] {
            assert_eq!(WorkloadKind::from_classifier(model).classifier_model(), Some(model));
        }
    }
}
