"""The hybrid drafter tests' targets (Qwen3-Next, Qwen3.5 and its MoE, Nemotron-H): a small vocabulary, so that random
drafts are accepted now and then, their prompts, and checkpoints with the target's own MTP layers."""

import json

import torch
from safetensors.torch import load_file, save_file

from helpers.hybrid_models import make_hybrid, save_hybrid
from outpace.model_config import ModelConfig
from outpace.models.loader import build_model

VOCAB = 13  # random drafters then propose the target's token now and then
PROMPTS = [[1, 5, 2, 7, 3], [4, 4, 8, 1, 9, 12, 0, 3, 5, 6, 2], [2, 11]]
MTP_LAYERS = {
    "qwen3_next": 1,
    "qwen3_5": 2,
    "qwen3_5_moe": 1,
    "nemotron_h": 1,  # its MTP stack (attention, then experts) as one step
}  # one layer reused step after step; two chained


def save_with_mtp(variant: str, path, num_layers: int, seed: int = 1):
    """A hybrid checkpoint with ``num_layers`` random MTP layers under the family's names (Qwen: config.json's
    ``mtp_num_hidden_layers``; Nemotron-H: ``num_nextn_predict_layers`` and transformers' default
    ``mtp_layers_block_type``); returns (the transformers model, the directory)."""
    hf = make_hybrid(variant, vocab_size=VOCAB)
    save_hybrid(hf, path)
    cfg = json.loads((path / "config.json").read_text())
    nemotron = variant.startswith("nemotron_h")
    cfg["num_nextn_predict_layers" if nemotron else "mtp_num_hidden_layers"] = num_layers
    (path / "config.json").write_text(json.dumps(cfg))
    g = torch.Generator().manual_seed(seed)
    tensors = load_file(path / "model.safetensors")
    model = build_model(ModelConfig.from_pretrained(path), torch.float32)
    for name, p in model.named_parameters():
        if name.startswith(
            "mtp."
        ):  # matrices 4x transformers' init; norms around 0 ((1 + w) scales) for
            # Qwen, around 1 for Nemotron-H's (w scales)
            value = torch.randn(p.shape, generator=g) * (0.1 if p.dim() == 1 else 0.08)
            if nemotron and "norm" in name:
                value += 1
            tensors[getattr(model, "checkpoint_name", str)(name)] = value
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    return hf, path
