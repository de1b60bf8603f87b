"""Random checkpoints of a given shape, written to disk: a target (any Llama-family config.json) and an
EAGLE3 draft for it.

``load_format="dummy"`` draws each rank's shard on its own, so a tensor-parallel engine and a one-rank
engine of the same "dummy" model compute different functions. A checkpoint on disk is one function that
every engine loads (each rank reading only its slices): what comparing TP = 2 with TP = 1 on a random
model needs, and what an EAGLE3 draft needs (drafts are always loaded from a checkpoint).

Values as the dummy load draws them: N(0, std) for matrices, 1 for norm weights, 0 for other vectors;
every tensor from its own seeded generator, drawn on ``device`` (8B parameters take seconds on a GPU),
and streamed to safetensors shards one tensor at a time (bench/widen.py ``write_checkpoint``).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from outpace.bench.widen import Entry, write_checkpoint
from outpace.model_config import ModelConfig
from outpace.models.drafts.eagle3 import Eagle3Config, Eagle3Draft
from outpace.models.loader import build_model

# EAGLE-3 drafts as SpecForge configures them (configs/llama3-8B-eagle3.json and the other *-eagle3.json):
# one Llama decoder layer at the target's hidden and intermediate sizes and head counts, the target's
# vocabulary, a draft vocabulary of 32000 tokens.
DRAFT_VOCAB_SIZE = 32000


def _entries(
    module: torch.nn.Module, dtype: torch.dtype, seed: int, std: float, device: str
) -> list[Entry]:
    """A (meta-device) module's parameters as checkpoint entries of random values."""
    to_ckpt = getattr(module, "checkpoint_name", lambda n: n)
    entries = []
    for i, (name, p) in enumerate(module.named_parameters()):

        def build(shape=tuple(p.shape), name=name, i=i) -> torch.Tensor:
            if len(shape) == 1:
                return torch.full(shape, 1.0 if "norm" in name else 0.0, dtype=dtype)
            g = torch.Generator(device=device).manual_seed(seed * 1_000_003 + i)
            return (
                (torch.randn(shape, generator=g, device=device, dtype=torch.float32) * std)
                .to(dtype)
                .cpu()
            )

        entries.append((to_ckpt(name), tuple(p.shape), dtype, build))
    return entries


def _written(out_dir: Path, config: dict) -> bool:
    """The checkpoint is already there (same config.json: written last, so a complete one)."""
    path = out_dir / "config.json"
    return path.is_file() and json.loads(path.read_text()) == config


def random_target(
    out_dir: str | Path,
    config: dict,
    dtype: torch.dtype = torch.bfloat16,
    seed: int = 0,
    std: float = 0.02,
    device: str = "cpu",
) -> Path:
    """A random checkpoint of ``config`` (a config.json dict) in ``out_dir`` (kept when already written)."""
    out_dir = Path(out_dir)
    config = {**config, "random_checkpoint": {"seed": seed, "std": std}}
    if not _written(out_dir, config):
        (out_dir / "config.json").unlink(missing_ok=True)
        model = build_model(ModelConfig.from_dict(config), dtype, "meta")
        write_checkpoint(
            out_dir, _entries(model, dtype, seed, std, device), desc=f"random {out_dir.name}"
        )
        (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out_dir


def eagle3_config(target: dict, draft_vocab_size: int = DRAFT_VOCAB_SIZE) -> dict:
    """An EAGLE3 draft's config.json for a target's config (the layout above; aux layers: the default)."""
    keys = (
        "hidden_size",
        "intermediate_size",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "vocab_size",
        "rms_norm_eps",
        "rope_theta",
        "rope_scaling",
        "max_position_embeddings",
    )
    return {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "num_hidden_layers": 1,
        **{k: target[k] for k in keys if k in target},
        "draft_vocab_size": min(draft_vocab_size, target["vocab_size"]),
        "target_hidden_size": target["hidden_size"],
        "tie_word_embeddings": False,
        "torch_dtype": target.get("torch_dtype", "bfloat16"),
    }


def random_eagle3_draft(
    out_dir: str | Path,
    target: dict,
    dtype: torch.dtype = torch.bfloat16,
    seed: int = 1,
    std: float = 0.02,
    device: str = "cpu",
    draft_vocab_size: int = DRAFT_VOCAB_SIZE,
) -> Path:
    """A random EAGLE3 draft for a target of config ``target``, with its own head over the first
    ``draft_vocab_size`` target ids (d2t = 0, t2d marks them) and the target's embedding."""
    out_dir = Path(out_dir)
    config = {
        **eagle3_config(target, draft_vocab_size),
        "random_checkpoint": {"seed": seed, "std": std},
    }
    if not _written(out_dir, config):
        (out_dir / "config.json").unlink(missing_ok=True)
        with torch.device("meta"):
            draft = Eagle3Draft(Eagle3Config.from_dict(config), has_embedding=False, has_head=True)
        dv, vocab = config["draft_vocab_size"], config["vocab_size"]
        entries = _entries(draft, dtype, seed, std, device)
        entries.append(("d2t", (dv,), torch.int64, lambda: torch.zeros(dv, dtype=torch.int64)))
        entries.append(("t2d", (vocab,), torch.bool, lambda: torch.arange(vocab) < dv))
        write_checkpoint(out_dir, entries, desc=f"random {out_dir.name}")
        (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out_dir
