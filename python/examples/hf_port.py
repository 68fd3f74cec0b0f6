"""The PyTorch side of a port check (examples/hf_port.rs is the candle side): a transformers
Qwen2 or Llama with a small config and seeded weights, written as a Hugging Face checkpoint that
candle-transformers loads unmodified, and its run recorded into a repro trace under the names
the candle side uses.

    python python/examples/hf_port.py MODEL_DIR OUT [--device cpu|cuda] [--family qwen2|llama]

Writes MODEL_DIR/{config.json, model.safetensors, tokens.json} when MODEL_DIR has no
config.json yet, and three copies of the config, each with one port bug planted, in
MODEL_DIR/bugs/: `rms_norm_eps.json` (1e-6 read as 1e-2), `rope_theta.json` (10,000 read as
1,000,000) and `hidden_act.json` (SiLU read as GELU). Then records OUT: the token ids, each
layer's output (`model.layers.K`: the model cut after layer K, as the candle side takes it:
Qwen2's hidden states with the final norm applied, Llama's last-position logits) and the last
position's logits.
"""

import argparse
import copy
import json
import os

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from repro.torch import Recorder

BUGS = {"rms_norm_eps": 1e-2, "rope_theta": 1_000_000.0, "hidden_act": "gelu"}


def write_checkpoint(model_dir: str, family: str) -> None:
    shape = dict(
        vocab_size=512, hidden_size=128, intermediate_size=384, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-6, rope_theta=10_000.0,
        hidden_act="silu", tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    if family == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**shape, use_sliding_window=False)).eval()
    else:
        model = LlamaForCausalLM(LlamaConfig(**shape)).eval()
    config = model.config
    model.save_pretrained(model_dir, safe_serialization=True)
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, config.vocab_size, (2, 64), generator=g)
    with open(os.path.join(model_dir, "tokens.json"), "w") as f:
        json.dump(tokens.tolist(), f)
    os.makedirs(os.path.join(model_dir, "bugs"), exist_ok=True)
    with open(os.path.join(model_dir, "config.json")) as f:
        written = json.load(f)
    for key, wrong in BUGS.items():
        planted = copy.deepcopy(written)
        planted[key] = wrong
        if key == "rope_theta" and isinstance(planted.get("rope_parameters"), dict):
            planted["rope_parameters"]["rope_theta"] = wrong
        with open(os.path.join(model_dir, "bugs", f"{key}.json"), "w") as f:
            json.dump(planted, f, indent=2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model_dir")
    parser.add_argument("out")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--family", default="qwen2", choices=["qwen2", "llama"])
    args = parser.parse_args()
    os.makedirs(args.model_dir, exist_ok=True)
    if not os.path.exists(os.path.join(args.model_dir, "config.json")):
        write_checkpoint(args.model_dir, args.family)
    device = torch.device(args.device)
    full = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32).to(device).eval()
    # candle's Llama returns the last position's logits only, so its cut models are compared there.
    last_logits = full.config.model_type == "llama"
    with open(os.path.join(args.model_dir, "tokens.json")) as f:
        tokens = torch.tensor(json.load(f), dtype=torch.int64, device=device)
    run = {"workload": "hf-port", "steps": 1, "params": {"framework": "transformers"}}
    rec = Recorder(args.out, run, device=device, replace=True)
    with torch.no_grad(), rec.step(0) as s:
        s.record("tokens", tokens.to(torch.uint32), "input")
        previous, layers = "tokens", full.model.layers
        for layer in range(full.config.num_hidden_layers):
            # The model cut after `layer`: its first layer + 1 layers, then the final norm.
            full.model.layers = layers[: layer + 1]
            try:
                if last_logits:
                    output = full(input_ids=tokens).logits[:, -1, :]
                else:
                    output = full.model(input_ids=tokens).last_hidden_state
            finally:
                full.model.layers = layers
            name = f"model.layers.{layer}"
            s.record(name, output, "op_output", "forward", inputs=[previous])
            previous = name
        logits = full(input_ids=tokens).logits[:, -1, :]
        s.record("logits", logits, "prediction", "forward", inputs=[previous])
    rec.finish()
    print(f"recorded {full.config.num_hidden_layers} layers of {args.model_dir} into {args.out}")


if __name__ == "__main__":
    main()
