//! A built-in workload's settings as text, through one serde struct per workload config: what
//! a trace header's `run.params` holds (`run_config`), what is read back from one (what a rank
//! process trains, what `repro gate --baseline` runs, what a child of `repro overhead` times),
//! and what the command line's options are laid over (`Workload::from_run_config`). A setting
//! is a config's field: its key is the field's serde name, its text serde_plain's (`Display`
//! for numbers, so a learning rate reads `0.001`), its default the config's.
//!
//! A header is input: every setting must be the workload's own and parse as its type, or the
//! error names it; a setting absent takes the workload's default (headers written before the
//! setting existed leave it out), or the value of the setting it follows (`Settings::FOLLOWS`).

use super::{Workload, WorkloadError, WorkloadKind};
use crate::record::Perturbation;
use crate::trace::RunConfig;
use serde::de::{self, DeserializeOwned, DeserializeSeed, IntoDeserializer, Visitor};
use serde::ser::{self, Impossible, Serialize};
use std::collections::{btree_map, BTreeMap};
use std::fmt;

/// A workload config as a trace header holds it. Serde says each setting's key and text; these
/// say what serde cannot.
pub(crate) trait Settings: Serialize + DeserializeOwned {
    /// Settings that take another's value where a header or a command line leaves them out:
    /// `(setting, the setting it follows)`.
    const FOLLOWS: &'static [(&'static str, &'static str)] = &[];
    /// Command-line options named otherwise than the setting they give: `(option, setting)`.
    const OPTIONS: &'static [(&'static str, &'static str)] = &[];
    /// Settings every header of the workload holds, with one value: `(setting, value)`.
    const FIXED: &'static [(&'static str, &'static str)] = &[];

    /// Settings the header leaves out because others make them moot.
    fn moot(&self) -> &'static [&'static str] {
        &[]
    }
}

/// The header of a run of `config`: the workload `kind`, `steps` steps, and its settings.
pub(crate) fn run_config<T: Settings>(config: &T, kind: WorkloadKind, steps: u64) -> RunConfig {
    let mut params = to_params(config);
    params.extend(T::FIXED.iter().map(|&(key, value)| (key.to_string(), value.to_string())));
    for key in config.moot() {
        params.remove(*key);
    }
    RunConfig { workload: kind.name().into(), steps: Some(steps), params }
}

/// The config of workload `kind` that `params` describe, each setting absent taking its value
/// in `defaults` (or the value of the setting it follows).
pub(super) fn read<T: Settings>(
    kind: WorkloadKind,
    defaults: &T,
    params: &BTreeMap<String, String>,
) -> Result<T, WorkloadError> {
    let mut given = params.clone();
    for &(key, value) in T::FIXED {
        match given.remove(key) {
            Some(text) if text != value => return Err(bad_setting(kind, key, &text, format!("expected {value}"))),
            _ => {}
        }
    }
    for &(key, leader) in T::FOLLOWS {
        if let (false, Some(value)) = (given.contains_key(key), given.get(leader).cloned()) {
            given.insert(key.to_string(), value);
        }
    }
    if let Some((key, value)) = given.iter().find(|(key, _)| !keys::<T>().contains(&key.as_str())) {
        let (key, value) = (key.clone(), value.clone());
        return Err(WorkloadError::UnknownSetting { workload: kind.to_string(), key, value });
    }
    let mut all = to_params(defaults);
    all.extend(given);
    T::deserialize(Params { kind, params: &all }).map_err(|ReadError(e)| e)
}

/// A setting of `kind`'s header whose value does not parse, and why.
fn bad_setting(kind: WorkloadKind, key: &str, value: &str, reason: String) -> WorkloadError {
    WorkloadError::BadSetting { workload: kind.to_string(), key: key.into(), value: value.into(), reason }
}

/// A built-in workload with the fault planted in it, if any: everything a recording of it
/// needs besides the device and the capture policy.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkloadRun {
    /// What trains.
    pub workload: Workload,
    /// The fault planted (`--perturb`), recorded in the header as the `perturb` setting.
    pub perturbation: Option<Perturbation>,
}

impl WorkloadRun {
    /// `workload` with `perturbation` planted, checked.
    pub fn new(workload: Workload, perturbation: Option<Perturbation>) -> Result<WorkloadRun, WorkloadError> {
        let run = WorkloadRun { workload, perturbation };
        run.validate()?;
        Ok(run)
    }

    /// Reads the workload a trace header describes (see the module's documentation), checked
    /// as the command line's settings are.
    pub fn from_run_config(run: &RunConfig) -> Result<WorkloadRun, WorkloadError> {
        let mut run = run.clone();
        let perturb = run.params.remove("perturb");
        let workload = Workload::from_run_config(&run)?;
        let perturbation = perturb
            .map(|p| {
                p.parse()
                    .map_err(|e: crate::record::RecordError| bad_setting(workload.kind(), "perturb", &p, e.to_string()))
            })
            .transpose()?;
        WorkloadRun::new(workload, perturbation)
    }

    /// Checks the settings and the perturbation before anything is recorded.
    pub fn validate(&self) -> Result<(), WorkloadError> {
        self.workload.validate(self.perturbation.as_ref())
    }

    /// The header of a recording of this run: the workload's settings and the planted fault.
    pub fn run_config(&self) -> RunConfig {
        let mut run = self.workload.run_config();
        if let Some(p) = &self.perturbation {
            run.params.insert("perturb".into(), p.to_string());
        }
        run
    }
}

/// A struct's fields as text, by their serde names: how a header writes settings (and how the
/// command line's options are read as settings). An `Option` that is `None` is written empty.
///
/// # Panics
/// If `value` is not a struct of plain values (numbers, text, unit enums).
pub fn to_params<T: Serialize>(value: &T) -> BTreeMap<String, String> {
    value.serialize(Fields).expect("settings are a struct of plain values")
}

/// Whether `value` is its type's default: a setting a header leaves out then.
pub(crate) fn is_default<T: Default + PartialEq>(value: &T) -> bool {
    *value == T::default()
}

/// Settings of these types are their text (`Display`, and `FromStr` with its message).
macro_rules! settings_as_text {
    ($($t:ty),*) => {$(
        impl serde::Serialize for $t {
            fn serialize<S: serde::ser::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }
        impl<'de> serde::Deserialize<'de> for $t {
            fn deserialize<D: serde::de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                <String as serde::Deserialize>::deserialize(d)?.parse().map_err(serde::de::Error::custom)
            }
        }
    )*};
}
pub(super) use settings_as_text;

/// The serializer of `to_params`: a struct's fields, each by serde_plain.
struct Fields;

macro_rules! not_a_struct {
    ($($method:ident($($arg:ty),*) -> $ret:ty;)*) => {$(
        fn $method(self, $(_: $arg),*) -> Result<$ret, serde_plain::Error> {
            Err(serde_plain::Error::ImpossibleSerialization("anything but a struct of settings"))
        }
    )*};
}

impl ser::Serializer for Fields {
    type Ok = BTreeMap<String, String>;
    type Error = serde_plain::Error;
    type SerializeSeq = Impossible<Self::Ok, Self::Error>;
    type SerializeTuple = Impossible<Self::Ok, Self::Error>;
    type SerializeTupleStruct = Impossible<Self::Ok, Self::Error>;
    type SerializeTupleVariant = Impossible<Self::Ok, Self::Error>;
    type SerializeMap = Impossible<Self::Ok, Self::Error>;
    type SerializeStruct = FieldTexts;
    type SerializeStructVariant = Impossible<Self::Ok, Self::Error>;

    fn serialize_struct(self, _: &'static str, _: usize) -> Result<FieldTexts, Self::Error> {
        Ok(FieldTexts(BTreeMap::new()))
    }

    fn serialize_some<T: ?Sized + Serialize>(self, _: &T) -> Result<Self::Ok, Self::Error> {
        self.serialize_unit()
    }

    fn serialize_newtype_struct<T: ?Sized + Serialize>(self, _: &'static str, _: &T) -> Result<Self::Ok, Self::Error> {
        self.serialize_unit()
    }

    fn serialize_newtype_variant<T: ?Sized + Serialize>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: &T,
    ) -> Result<Self::Ok, Self::Error> {
        self.serialize_unit()
    }

    not_a_struct! {
        serialize_bool(bool) -> Self::Ok;
        serialize_i8(i8) -> Self::Ok;
        serialize_i16(i16) -> Self::Ok;
        serialize_i32(i32) -> Self::Ok;
        serialize_i64(i64) -> Self::Ok;
        serialize_u8(u8) -> Self::Ok;
        serialize_u16(u16) -> Self::Ok;
        serialize_u32(u32) -> Self::Ok;
        serialize_u64(u64) -> Self::Ok;
        serialize_f32(f32) -> Self::Ok;
        serialize_f64(f64) -> Self::Ok;
        serialize_char(char) -> Self::Ok;
        serialize_str(&str) -> Self::Ok;
        serialize_bytes(&[u8]) -> Self::Ok;
        serialize_none() -> Self::Ok;
        serialize_unit() -> Self::Ok;
        serialize_unit_struct(&'static str) -> Self::Ok;
        serialize_unit_variant(&'static str, u32, &'static str) -> Self::Ok;
        serialize_seq(Option<usize>) -> Self::SerializeSeq;
        serialize_tuple(usize) -> Self::SerializeTuple;
        serialize_tuple_struct(&'static str, usize) -> Self::SerializeTupleStruct;
        serialize_tuple_variant(&'static str, u32, &'static str, usize) -> Self::SerializeTupleVariant;
        serialize_map(Option<usize>) -> Self::SerializeMap;
        serialize_struct_variant(&'static str, u32, &'static str, usize) -> Self::SerializeStructVariant;
    }
}

/// The fields `Fields` has serialized so far.
struct FieldTexts(BTreeMap<String, String>);

impl ser::SerializeStruct for FieldTexts {
    type Ok = BTreeMap<String, String>;
    type Error = serde_plain::Error;

    fn serialize_field<T: ?Sized + Serialize>(&mut self, key: &'static str, value: &T) -> Result<(), Self::Error> {
        self.0.insert(key.to_string(), value.serialize(serde_plain::Serializer)?);
        Ok(())
    }

    fn end(self) -> Result<Self::Ok, Self::Error> {
        Ok(self.0)
    }
}

/// The deserializer of `read`: a header's settings as a struct's fields, each by serde_plain.
struct Params<'de> {
    kind: WorkloadKind,
    params: &'de BTreeMap<String, String>,
}

/// An error reading settings (`WorkloadError`, through serde).
#[derive(Debug)]
struct ReadError(WorkloadError);

impl fmt::Display for ReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for ReadError {}

impl de::Error for ReadError {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        ReadError(WorkloadError::Invalid(msg.to_string()))
    }
}

impl<'de> de::Deserializer<'de> for Params<'de> {
    type Error = ReadError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, ReadError> {
        visitor.visit_map(Entries { kind: self.kind, entries: self.params.iter(), value: None })
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf option unit
        unit_struct newtype_struct seq tuple tuple_struct map struct enum identifier ignored_any
    }
}

/// A header's settings one by one, each value's error naming its setting.
struct Entries<'de> {
    kind: WorkloadKind,
    entries: btree_map::Iter<'de, String, String>,
    value: Option<(&'de str, &'de str)>,
}

impl<'de> de::MapAccess<'de> for Entries<'de> {
    type Error = ReadError;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>, ReadError> {
        let Some((key, value)) = self.entries.next() else { return Ok(None) };
        self.value = Some((key, value));
        seed.deserialize(key.as_str().into_deserializer()).map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, ReadError> {
        let (key, value) = self.value.take().expect("a setting's key comes before its value");
        seed.deserialize(serde_plain::Deserializer::new(value))
            .map_err(|e| ReadError(bad_setting(self.kind, key, value, e.to_string())))
    }
}

/// The settings `T` has, by key: the fields serde reads.
pub(super) fn keys<T: DeserializeOwned>() -> &'static [&'static str] {
    serde_aux::serde_introspection::serde_introspect::<T>()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::Reductions;
    use crate::workloads::{
        AdderConfig, ClassifierConfig, DatasetName, DecoderConfig, DecoderShape, Family, Formulation, GptConfig,
        ModelKind, Norm,
    };
    use candle_core::DType;

    fn every_workload() -> Vec<WorkloadRun> {
        let run = |workload, perturbation: Option<&str>| WorkloadRun {
            workload,
            perturbation: perturbation.map(|p| p.parse().unwrap()),
        };
        vec![
            run(Workload::Adder(AdderConfig::default()), None),
            run(
                Workload::Adder(AdderConfig {
                    seed: 3,
                    data_seed: 9,
                    steps: 7,
                    batch: 200,
                    features: 5,
                    lr: 0.25,
                    formulation: Formulation::Matmul,
                    reductions: Reductions::Candle,
                }),
                Some("2:loss.sum:3@1"),
            ),
            // A learning rate whose text `{}` and a float parser could disagree on.
            run(Workload::Adder(AdderConfig { lr: 1e-7, ..AdderConfig::default() }), None),
            run(Workload::Gpt(GptConfig::default()), None),
            run(
                Workload::Gpt(GptConfig {
                    seed: 5,
                    steps: 3,
                    width: 64,
                    heads: 2,
                    lr: 0.1 + 0.2,
                    norm: Norm::Fused,
                    reductions: Reductions::Ordered,
                    batch_invariant: true,
                    ..GptConfig::default()
                }),
                Some("1:wpe.weight:1"),
            ),
            run(Workload::Decoder(DecoderConfig::default()), None),
            run(
                Workload::Decoder(DecoderConfig {
                    family: Family::Qwen2,
                    shape: DecoderShape::Qwen2_0_5B,
                    dtype: DType::BF16,
                    layers: 1,
                    tokens: 16,
                    ..DecoderConfig::default()
                }),
                None,
            ),
            run(Workload::Decoder(DecoderConfig { family: Family::Gemma, ..DecoderConfig::default() }), None),
            run(Workload::Classifier(ClassifierConfig::defaults(ModelKind::Mlp)), None),
            run(
                Workload::Classifier(ClassifierConfig {
                    dataset: DatasetName::Gauss5d,
                    examples: Some(64),
                    max_steps: Some(3),
                    init_seed: 1,
                    order_seed: 2,
                    augment_seed: 3,
                    dropout_seed: 4,
                    dropout: 0.5,
                    ..ClassifierConfig::defaults(ModelKind::Mlp)
                }),
                None,
            ),
            run(Workload::Classifier(ClassifierConfig::defaults(ModelKind::Cnn)), None),
            run(Workload::Classifier(ClassifierConfig::defaults(ModelKind::ResNet18)), None),
        ]
    }

    #[test]
    fn every_workload_reads_back_from_its_header_as_the_same_run() {
        for run in every_workload() {
            let header = run.run_config();
            let read = WorkloadRun::from_run_config(&header).unwrap_or_else(|e| panic!("{header:?}: {e}"));
            // The header is what a recording trains from: it must come back unchanged.
            assert_eq!(read.run_config(), header);
            assert_eq!(read.perturbation, run.perturbation);
            match (&read.workload, &run.workload) {
                // A classifier's header holds the steps it trains, not whether they were asked for.
                (Workload::Classifier(read), Workload::Classifier(run)) => {
                    assert_eq!(ClassifierConfig { max_steps: run.max_steps, ..read.clone() }, *run)
                }
                (read, run) => assert_eq!(read, run),
            }
        }
    }

    #[test]
    fn a_header_writes_each_setting_as_before() {
        let gpt = GptConfig { lr: 1e-3, ..GptConfig::default() }.run_config();
        let keys: Vec<&str> = gpt.params.keys().map(String::as_str).collect();
        // Reductions and the batch-invariant mode only where they are not the default.
        assert_eq!(keys, ["batch", "context", "data_seed", "heads", "layers", "lr", "norm", "seed", "width"]);
        assert_eq!((gpt.params["lr"].as_str(), gpt.params["norm"].as_str()), ("0.001", "ops"));
        let adder = AdderConfig { lr: 1e-7, ..AdderConfig::default() }.run_config();
        assert_eq!((adder.params["lr"].as_str(), adder.params["dtype"].as_str()), ("0.0000001", "F32"));
        let mlp = ClassifierConfig::defaults(ModelKind::Mlp).run_config();
        assert_eq!((mlp.params["examples"].as_str(), mlp.params["dropout"].as_str()), ("all", "0"));
        let qwen = DecoderConfig { shape: DecoderShape::Qwen2_0_5B, ..DecoderConfig::default() }.run_config();
        assert!(!qwen.params.contains_key("width") && qwen.params["shape"] == "qwen2-0.5b", "{qwen:?}");
    }

    #[test]
    fn a_setting_left_out_takes_its_default_or_the_one_it_follows() {
        let mut header = ClassifierConfig { init_seed: 7, ..ClassifierConfig::defaults(ModelKind::Cnn) }.run_config();
        header.params.retain(|key, _| key == "init_seed");
        let Workload::Classifier(read) = Workload::from_run_config(&header).unwrap() else { panic!() };
        assert_eq!((read.order_seed, read.augment_seed, read.dropout_seed), (7, 7, 7));
        assert_eq!((read.dataset_seed, read.augment_shift), (0, 1), "cnn's defaults");
        let mut header = GptConfig::default().run_config();
        header.params.retain(|key, _| key == "seed");
        header.params.insert("seed".into(), "4".into());
        let Workload::Gpt(read) = Workload::from_run_config(&header).unwrap() else { panic!() };
        assert_eq!(read, GptConfig { seed: 4, data_seed: 4, ..GptConfig::default() });
    }

    #[test]
    fn a_header_that_is_not_a_built_in_workloads_is_refused_naming_the_setting() {
        let mut header = WorkloadRun { workload: Workload::Gpt(GptConfig::default()), perturbation: None }.run_config();
        header.params.insert("help".into(), "true".into());
        let e = WorkloadRun::from_run_config(&header).unwrap_err().to_string();
        assert!(e.contains("setting `help` = `true` is not a setting of gpt"), "{e}");

        header.params.remove("help");
        header.params.insert("width".into(), "wide".into());
        let e = WorkloadRun::from_run_config(&header).unwrap_err().to_string();
        assert!(e.contains("setting `width` = `wide` of gpt is not valid"), "{e}");

        header.params.insert("width".into(), "130".into());
        let e = WorkloadRun::from_run_config(&header).unwrap_err().to_string();
        assert!(e.contains("must be a positive multiple of --heads"), "{e}");

        header.params.insert("norm".into(), "rms".into());
        let e = WorkloadRun::from_run_config(&header).unwrap_err().to_string();
        assert!(e.contains("setting `norm` = `rms` of gpt") && e.contains("expected ops or fused"), "{e}");

        header.params.insert("norm".into(), "ops".into());
        header.params.insert("perturb".into(), "x".into());
        let e = WorkloadRun::from_run_config(&header).unwrap_err().to_string();
        assert!(e.contains("setting `perturb` = `x` of gpt is not valid"), "{e}");

        let mut adder = AdderConfig::default().run_config();
        adder.params.insert("dtype".into(), "BF16".into());
        let e = WorkloadRun::from_run_config(&adder).unwrap_err().to_string();
        assert!(e.contains("setting `dtype` = `BF16` of adder is not valid: expected F32"), "{e}");

        let mut qwen = DecoderConfig::default().run_config();
        qwen.params.insert("dtype".into(), "f16".into());
        let e = WorkloadRun::from_run_config(&qwen).unwrap_err().to_string();
        assert!(e.contains("setting `dtype` = `f16` of qwen2 is not valid: expected f32 or bf16"), "{e}");

        let other = RunConfig { workload: "bert".into(), steps: None, params: BTreeMap::new() };
        let e = WorkloadRun::from_run_config(&other).unwrap_err().to_string();
        assert!(e.contains("`bert` is not a built-in workload"), "{e}");
    }

    #[test]
    fn each_workload_s_options_are_its_settings_under_their_command_line_names() {
        let names = |kind: WorkloadKind| kind.options().into_iter().map(|(o, _)| o).collect::<Vec<_>>();
        assert_eq!(
            names(WorkloadKind::Adder),
            ["seed", "data-seed", "batch", "features", "lr", "formulation", "reductions"]
        );
        let classifier = WorkloadKind::Mlp.options();
        assert!(
            classifier.contains(&("seed".into(), "init_seed"))
                && classifier.contains(&("data-seed".into(), "dataset_seed"))
        );
        assert!(WorkloadKind::Qwen2.options().contains(&("context".into(), "tokens")));
        assert_eq!(names(WorkloadKind::Gemma), names(WorkloadKind::Qwen2));
    }
}
