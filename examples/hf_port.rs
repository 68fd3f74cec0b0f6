//! A port check: a Hugging Face Qwen2 checkpoint run, unmodified, by candle-transformers'
//! `qwen2`, recorded layer by layer so that `repro diff` compares it with transformers' own run
//! of the same checkpoint (`python/examples/hf_port.py`, which writes the checkpoint, the token
//! ids and the PyTorch trace).
//!
//! candle-transformers' models expose no intermediate outputs, so each layer's output is taken
//! by cutting the model after that layer: `model.layers.K` is the output of a model of the first
//! K + 1 layers of the same weights (the final norm applied), recorded as computed from
//! `model.layers.K-1`. The PyTorch side records the same. Then `logits` (the last position's)
//! of the whole model.
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
//! `--device cpu|cuda:N`.

use candle_core::{DType, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::qwen2;
use repro::record::{open_device, RecordOptions, Recorder};
use repro::trace::{RunConfig, TensorKind};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

type Error = Box<dyn std::error::Error>;

/// The checkpoint's config.json as candle-transformers' `qwen2::Config` reads it. transformers
/// writes `sliding_window: null` when sliding windows are off, and newer versions keep the
/// rotary base under `rope_parameters`: both are filled in as the PyTorch model reads them.
fn read_config(path: &Path) -> Result<qwen2::Config, Error> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mut json: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| format!("{} is not JSON: {e}", path.display()))?;
    let map = json.as_object_mut().ok_or_else(|| format!("{} is not a JSON object", path.display()))?;
    if map.get("sliding_window").is_none_or(|v| v.is_null()) {
        let positions = map.get("max_position_embeddings").cloned().unwrap_or(serde_json::Value::from(0));
        map.insert("sliding_window".into(), positions);
    }
    if !map.contains_key("rope_theta") {
        let theta = map.get("rope_parameters").and_then(|p| p.get("rope_theta")).cloned();
        map.insert("rope_theta".into(), theta.unwrap_or(serde_json::Value::from(10_000.0)));
    }
    for (key, default) in [("max_window_layers", 0), ("use_sliding_window", 0)] {
        if !map.contains_key(key) {
            map.insert(key.into(), if key == "use_sliding_window" { false.into() } else { default.into() });
        }
    }
    serde_json::from_value(json).map_err(|e| format!("{}: not a Qwen2 config: {e}", path.display()).into())
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
    for layer in 0..config.num_hidden_layers {
        let cut = qwen2::Config { num_hidden_layers: layer + 1, ..config.clone() };
        let output = qwen2::Model::new(&cut, vb.clone())?.forward(&tokens, 0, None)?;
        let name = format!("model.layers.{layer}");
        s.op(&name, &[&previous], output)?;
        previous = name;
    }
    let logits = qwen2::ModelForCausalLM::new(&config, vb)?.forward(&tokens, 0)?.squeeze(1)?;
    s.op_as("logits", TensorKind::Prediction, &[&previous], logits)?;
    s.finish()?;
    recorder.finish()?;
    eprintln!("recorded {} layers of {} into {}", config.num_hidden_layers, weights.display(), out.display());
    Ok(())
}
