"""Random EAGLE3 draft checkpoints for tests, built for a given target directory."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from outpace.checkpoint import model_state_dict, save_checkpoint
from outpace.model_config import ModelConfig
from outpace.models.drafts.dflash import DFlashConfig, DFlashDraft
from outpace.models.drafts.eagle3 import Eagle3Config, Eagle3Draft
from outpace.models.loader import build_model


def random_llama(
    path: Path,
    vocab_size: int,
    seed: int,
    mtp_layers: int = 0,
    chained: bool = True,
    num_layers: int = 2,
    std: float = 0.4,
) -> Path:
    """A random Llama checkpoint written by outpace itself (so it can carry MTP layers)."""
    from transformers import LlamaConfig

    cfg = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        eos_token_id=None,
    ).to_dict()
    cfg.update(
        architectures=["LlamaForCausalLM"],
        num_nextn_predict_layers=mtp_layers,
        chain_mtp_hidden_states=chained,
    )
    torch.manual_seed(seed)
    model = build_model(ModelConfig.from_dict(cfg), torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.ones_like(p) if p.dim() == 1 else torch.randn_like(p) * std)
    save_checkpoint(model_state_dict(model), path)
    (Path(path) / "config.json").write_text(json.dumps(cfg))
    return Path(path)


def eagle3_config(
    target_dir: Path, draft_vocab_size: int | None = None, aux_ids=None, **extra
) -> dict:
    t = json.loads((Path(target_dir) / "config.json").read_text())
    cfg = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": t["hidden_size"],
        "intermediate_size": t["intermediate_size"],
        "num_attention_heads": t["num_attention_heads"],
        "num_key_value_heads": t["num_key_value_heads"],
        "head_dim": t.get("head_dim"),
        "num_hidden_layers": 1,
        "vocab_size": t["vocab_size"],
        "draft_vocab_size": draft_vocab_size or t["vocab_size"],
        "target_hidden_size": t["hidden_size"],
        "rms_norm_eps": t.get("rms_norm_eps", 1e-6),
        "max_position_embeddings": t["max_position_embeddings"],
        "rope_theta": t.get("rope_theta", 10000.0),
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
    }
    if aux_ids is not None:
        cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(aux_ids)}
    cfg.update(extra)
    return cfg


def make_eagle3_draft(
    target_dir: Path,
    out_dir: Path,
    draft_vocab_size: int | None = None,
    aux_ids=None,
    seed: int = 0,
    has_embedding: bool = False,
    **extra,
) -> Path:
    """``has_embedding``: the draft carries its own embedding (needed when its hidden size differs from the
    target's)."""
    cfg = eagle3_config(target_dir, draft_vocab_size, aux_ids, **extra)
    torch.manual_seed(seed)
    draft = Eagle3Draft(Eagle3Config.from_dict(cfg), has_embedding=has_embedding, has_head=True)
    with torch.no_grad():
        for p in draft.parameters():
            p.copy_(
                torch.randn_like(p) * (0.1 if p.dim() == 1 else 0.3)
                + (1.0 if p.dim() == 1 else 0.0)
            )
        vocab, dv = cfg["vocab_size"], cfg["draft_vocab_size"]
        chosen = (
            torch.randperm(vocab, generator=torch.Generator().manual_seed(seed))[:dv].sort().values
        )
        draft.d2t.copy_(chosen - torch.arange(dv))
        draft.t2d.zero_()
        draft.t2d[chosen] = True
    tensors = model_state_dict(draft)
    tensors["d2t"], tensors["t2d"] = draft.d2t, draft.t2d
    out_dir.mkdir(parents=True, exist_ok=True)
    save_checkpoint(tensors, out_dir)
    (out_dir / "config.json").write_text(json.dumps(cfg, indent=2))
    return out_dir


def dflash_config_dict(
    target_dir,
    block_size=4,
    layer_ids=(0, 1, 3),
    mask_token_id=202,
    num_layers=2,
    num_target_layers=None,
    **extra,
) -> dict:
    """``num_target_layers`` None: the target config's num_hidden_layers (a Nemotron-H config has none)."""
    t = json.loads((target_dir / "config.json").read_text())
    cfg = {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "hidden_size": t["hidden_size"],
        "intermediate_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 12,
        "num_hidden_layers": num_layers,
        "vocab_size": t["vocab_size"],
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000.0,
        "max_position_embeddings": 256,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "num_target_layers": num_target_layers or t["num_hidden_layers"],
        "block_size": block_size,
        "dflash_config": {"mask_token_id": mask_token_id, "target_layer_ids": list(layer_ids)},
    }
    cfg.update(extra)
    return cfg


def make_dflash_draft(target_dir, out_dir, seed=0, target_hidden=None, **kwargs):
    cfg = dflash_config_dict(target_dir, **kwargs)
    torch.manual_seed(seed)
    draft = DFlashDraft(DFlashConfig.from_dict(cfg), target_hidden or cfg["hidden_size"])
    with torch.no_grad():  # weights large enough that attention is far from uniform
        for p in draft.parameters():
            p.copy_(
                1.0 + 0.2 * torch.randn_like(p)
                if p.dim() == 1
                else 1.5 * torch.randn_like(p) / p.shape[1] ** 0.5
            )
    out_dir.mkdir(parents=True, exist_ok=True)
    save_checkpoint(model_state_dict(draft), out_dir)
    (out_dir / "config.json").write_text(json.dumps(cfg, indent=2))
    return out_dir
