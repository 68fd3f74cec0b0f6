//! A port check: a Hugging Face Qwen2 or Llama checkpoint run, unmodified, by
//! candle-transformers' `qwen2` or `llama`, recorded layer by layer so that `repro diff` compares
//! it with transformers' own run of the same checkpoint (`python/examples/hf_port.py`, which
//! writes the checkpoint, the token ids and the PyTorch trace).
//!
//! candle-transformers' models expose no intermediate outputs, so each layer's output is taken
//! by cutting the model after that layer: `model.layers.K` is the output of a model of the first
//! K + 1 layers of the same weights, recorded as computed from `model.layers.K-1`. For Qwen2 that
//! is every position's hidden state (the final norm applied); candle's Llama returns only the last
//! position's logits, so for Llama it is those. The PyTorch side records the same. Then `logits`
//! (the last position's) of the whole model.
//!
//! ```text
//! python python/examples/hf_port.py runs/qwen2 runs/port-torch                 # checkpoint + torch run
//! cargo run --release --example hf_port -- runs/qwen2 runs/port-candle
//! repro diff runs/port-candle runs/port-torch --tolerance abs:1e-4             # WITHIN TOLERANCE
//! cargo run --release --example hf_port -- runs/qwen2 runs/port-bug --config runs/qwen2/bugs/rope_theta.json
//! repro diff runs/port-bug runs/port-torch --tolerance abs:1e-4                # names model.layers.0
//! ```
//!
//! Options after the two folders: `--config FILE` (a copy of config.json, to plant a port bug),
//! `--device cpu|cuda:N`. The family comes from the config's `model_type`.

use candle_core::{DType, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::{llama, qwen2};
use repro::record::{open_device, RecordOptions, Recorder};
use repro::trace::{RunConfig, TensorKind};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

type Error = Box<dyn std::error::Error>;

/// A checkpoint's model as candle-transformers reads its config.
enum Port {
    Qwen2(qwen2::Config),
    Llama(llama::Config),
}

impl Port {
    fn layers(&self) -> usize {
        match self {
            Port::Qwen2(c) => c.num_hidden_layers,
            Port::Llama(c) => c.num_hidden_layers,
        }
    }

    /// The output of the model cut after `layers` layers (see the module's documentation).
    fn cut(&self, layers: usize, vb: &VarBuilder, tokens: &Tensor) -> candle_core::Result<Tensor> {
        match self {
            Port::Qwen2(c) => {
                let cut = qwen2::Config { num_hidden_layers: layers, ..c.clone() };
                qwen2::Model::new(&cut, vb.clone())?.forward(tokens, 0, None)
            }
            Port::Llama(c) => {
                let cut = llama::Config { num_hidden_layers: layers, ..c.clone() };
                let mut cache = llama::Cache::new(false, DType::F32, &cut, tokens.device())?;
                llama::Llama::load(vb.clone(), &cut)?.forward(tokens, 0, &mut cache)
            }
        }
    }

    /// The last position's logits of the whole model.
    fn logits(&self, vb: &VarBuilder, tokens: &Tensor) -> candle_core::Result<Tensor> {
        match self {
            Port::Qwen2(c) => qwen2::ModelForCausalLM::new(c, vb.clone())?.forward(tokens, 0)?.squeeze(1),
            Port::Llama(c) => self.cut(c.num_hidden_layers, vb, tokens),
        }
    }
}

/// The checkpoint's config.json as candle-transformers reads it. transformers writes
/// `sliding_window: null` when sliding windows are off, and newer versions keep the rotary base
/// under `rope_parameters`: both are filled in as the PyTorch model reads them.
fn read_config(path: &Path) -> Result<Port, Error> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mut json: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| format!("{} is not JSON: {e}", path.display()))?;
    let map = json.as_object_mut().ok_or_else(|| format!("{} is not a JSON object", path.display()))?;
    if !map.contains_key("rope_theta") {
        let theta = map.get("rope_parameters").and_then(|p| p.get("rope_theta")).cloned();
        map.insert("rope_theta".into(), theta.unwrap_or(serde_json::Value::from(10_000.0)));
    }
    let family = map.get("model_type").and_then(|t| t.as_str()).unwrap_or_default().to_string();
    let bad = |e: serde_json::Error| format!("{}: not a {family} config: {e}", path.display());
    match family.as_str() {
        "qwen2" => {
            if map.get("sliding_window").is_none_or(|v| v.is_null()) {
                let positions = map.get("max_position_embeddings").cloned().unwrap_or(serde_json::Value::from(0));
                map.insert("sliding_window".into(), positions);
            }
            map.entry("max_window_layers").or_insert(0.into());
            map.entry("use_sliding_window").or_insert(false.into());
            Ok(Port::Qwen2(serde_json::from_value(json).map_err(bad)?))
        }
        "llama" => {
            let config: llama::LlamaConfig = serde_json::from_value(json).map_err(bad)?;
            Ok(Port::Llama(config.into_config(false)))
        }
        other => Err(format!("{}: model_type `{other}`; this example ports qwen2 and llama", path.display()).into()),
    }
}

fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (model_dir, out) = match args.as_slice() {
        [model, out, ..] => (PathBuf::from(model), PathBuf::from(out)),
        _ => return Err("usage: hf_port MODEL_DIR OUT [--config FILE] [--device cpu|cuda:N]".into()),
    };
    let option = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned();
    let config_path = option("--config").map(PathBuf::from).unwrap_or_else(|| model_dir.join("config.json"));
    let device = open_device(&option("--device").unwrap_or_else(|| "cpu".into()))?;
    let config = read_config(&config_path)?;
    let weights = model_dir.join("model.safetensors");
    // SAFETY: the checkpoint is not changed while it is mapped.
    let vb = unsafe { VarBuilder::from_mmaped_safetensors(&[&weights], DType::F32, &device) }
        .map_err(|e| format!("cannot load {}: {e}", weights.display()))?;
    let tokens_path = model_dir.join("tokens.json");
    let tokens: Vec<Vec<u32>> = serde_json::from_str(
        &std::fs::read_to_string(&tokens_path).map_err(|e| format!("cannot read {}: {e}", tokens_path.display()))?,
    )?;
    let (batch, len) = (tokens.len(), tokens.first().map_or(0, Vec::len));
    let tokens = Tensor::from_vec(tokens.concat(), (batch, len), &device)?;

    let run = RunConfig {
        workload: "hf-port".into(),
        steps: Some(1),
        params: BTreeMap::from([
            ("framework".into(), "candle-transformers".into()),
            ("config".into(), config_path.display().to_string()),
        ]),
    };
    // One step, which the default capture policy stores in full.
    let mut recorder = Recorder::create(&out, run, &device, RecordOptions::default().replacing(true))?;
    let mut s = recorder.step(0);
    s.record("tokens", TensorKind::Input, &tokens)?;
    let mut previous = "tokens".to_string();
    for layer in 0..config.layers() {
        let name = format!("model.layers.{layer}");
        s.op(&name, &[&previous], config.cut(layer + 1, &vb, &tokens)?)?;
        previous = name;
    }
    s.op_as("logits", TensorKind::Prediction, &[&previous], config.logits(&vb, &tokens)?)?;
    s.finish()?;
    recorder.finish()?;
    eprintln!("recorded {} layers of {} into {}", config.layers(), weights.display(), out.display());
    Ok(())
}
