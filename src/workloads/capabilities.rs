//! What each built-in workload can do besides recording itself: take a planted fault, train
//! data-parallel, have its forward pass checked for batch invariance, be trained by a study.
//!
//! Each capability is a method of `Workload` that matches every workload by name and returns
//! what the capability works on (the config that `repro invariance` or a study runs), never a
//! boolean kept apart from the code that uses it: a new workload is a compile error here until
//! it says what it can do. Messages list the workloads with a capability from the same methods
//! (`WorkloadKind::listed`), over each workload's defaults.

use super::{AdderConfig, ClassifierConfig, DecoderConfig, Family, GptConfig, Workload, WorkloadKind};

/// A model whose forward pass `repro invariance` checks.
#[derive(Debug, Clone, Copy)]
pub enum ForwardModel<'a> {
    /// The gpt.
    Gpt(&'a GptConfig),
    /// A candle-transformers decoder.
    Decoder(&'a DecoderConfig),
}

/// A workload that the multi-run studies (`repro study`) train: one that predicts classes runs
/// can disagree on.
#[derive(Debug, Clone, Copy)]
pub enum StudyModel<'a> {
    /// A classifier.
    Classifier(&'a ClassifierConfig),
    /// The gpt.
    Gpt(&'a GptConfig),
}

impl Workload {
    /// The workload `kind` with its default settings.
    pub fn defaults(kind: WorkloadKind) -> Workload {
        match kind {
            WorkloadKind::Adder => Workload::Adder(AdderConfig::default()),
            WorkloadKind::Mlp | WorkloadKind::Cnn | WorkloadKind::ResNet18 => {
                let model = kind.classifier_model().expect("a classifier workload");
                Workload::Classifier(ClassifierConfig::defaults(model))
            }
            WorkloadKind::Gpt => Workload::Gpt(GptConfig::default()),
            WorkloadKind::Qwen2 => {
                Workload::Decoder(DecoderConfig { family: Family::Qwen2, ..DecoderConfig::default() })
            }
            WorkloadKind::Gemma => {
                Workload::Decoder(DecoderConfig { family: Family::Gemma, ..DecoderConfig::default() })
            }
        }
    }

    /// Whether it trains (and so takes a planted fault, `--perturb`); the decoders record
    /// inference.
    pub fn is_trained(&self) -> bool {
        match self {
            Workload::Adder(_) | Workload::Classifier(_) | Workload::Gpt(_) => true,
            Workload::Decoder(_) => false,
        }
    }

    /// Whether it trains data-parallel over several devices (`--devices`).
    pub fn trains_data_parallel(&self) -> bool {
        match self {
            Workload::Classifier(_) | Workload::Gpt(_) => true,
            Workload::Adder(_) | Workload::Decoder(_) => false,
        }
    }

    /// The model whose forward pass `repro invariance` checks, if it has one.
    pub fn forward_model(&self) -> Option<ForwardModel<'_>> {
        match self {
            Workload::Gpt(c) => Some(ForwardModel::Gpt(c)),
            Workload::Decoder(c) => Some(ForwardModel::Decoder(c)),
            Workload::Adder(_) | Workload::Classifier(_) => None,
        }
    }

    /// What a study trains, if this workload can be studied (the adder and the decoders have
    /// no held-out predictions to compare).
    pub fn study_model(&self) -> Option<StudyModel<'_>> {
        match self {
            Workload::Classifier(c) => Some(StudyModel::Classifier(c)),
            Workload::Gpt(c) => Some(StudyModel::Gpt(c)),
            Workload::Adder(_) | Workload::Decoder(_) => None,
        }
    }
}

impl WorkloadKind {
    /// The workloads with a capability, for messages: `mlp, cnn, resnet18 or gpt`.
    pub fn listed(capability: fn(&Workload) -> bool) -> String {
        let names: Vec<&str> =
            Self::ALL.into_iter().filter(|&k| capability(&Workload::defaults(k))).map(Self::name).collect();
        match names.split_last() {
            Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
            _ => names.join(""),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_workload_s_defaults_are_of_its_kind_and_capabilities_list_in_help_order() {
        for kind in WorkloadKind::ALL {
            assert_eq!(Workload::defaults(kind).kind(), kind);
        }
        assert_eq!(WorkloadKind::listed(Workload::trains_data_parallel), "mlp, cnn, resnet18 or gpt");
        assert_eq!(WorkloadKind::listed(|w| w.forward_model().is_some()), "gpt, qwen2 or gemma");
        assert_eq!(WorkloadKind::listed(|w| w.study_model().is_some()), "mlp, cnn, resnet18 or gpt");
        assert_eq!(WorkloadKind::listed(Workload::is_trained), "adder, mlp, cnn, resnet18 or gpt");
        assert_eq!(WorkloadKind::listed(|w| w.kind() == WorkloadKind::Adder), "adder");
    }
}
