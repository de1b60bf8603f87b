"""The families' config-field walks (tests/engine/test_config_fields.py, tests/models/test_gemma.py,
test_deepseek.py, test_qwen3_moe.py): every field of a transformers config class is implemented, irrelevant to
inference, or refused by name. What every such class inherits from transformers' PreTrainedConfig and its
common text-model fields, where they do not change what inference computes, and why; and ``built``, what a config
builds, for walks that compare models rather than parsed configs."""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from outpace.model_config import ModelConfig
from outpace.registry import model_class

COMMON_IRRELEVANT = {
    "transformers_version",
    "_name_or_path",  # provenance
    "model_type",  # the architectures entry names the class
    "output_hidden_states",
    "output_attentions",
    "return_dict",  # what a transformers forward returns
    "use_cache",  # transformers' own KV cache switch
    "is_encoder_decoder",
    "chunk_size_feed_forward",  # not read by these decoder-only classes
    "id2label",
    "label2id",
    "problem_type",  # classification heads
    "initializer_range",  # initialisation
    "attention_dropout",  # training only (dropout is 0 in eval)
    "pad_token_id",
    "bos_token_id",  # the tokenizer's business
}


def _plain(value):
    """A module attribute as the description keeps it: a callable by name, a value by its repr; None for
    tensors, modules and objects whose repr is their address."""
    if isinstance(value, (torch.Tensor, nn.Module)):
        return None
    if callable(value) and hasattr(value, "__name__"):
        return value.__name__
    text = repr(value)
    return None if " at 0x" in text else text


def built(cfg: dict) -> tuple:
    """What ``cfg`` builds: its ModelConfig (without the raw dict) and the model on the meta device, described."""
    model_cfg = ModelConfig.from_dict(cfg)
    with torch.device("meta"):
        model = model_class(model_cfg.architecture)(model_cfg)
    tensors = tuple(
        (name, tuple(t.shape), t.dtype)
        for name, t in [*model.named_parameters(), *model.named_buffers()]
    )
    attributes = tuple(
        (name, type(module).__name__, key, _plain(value))
        for name, module in model.named_modules()
        for key, value in sorted(vars(module).items())
        if not key.startswith("_") and key != "training" and _plain(value) is not None
    )
    return dataclasses.replace(model_cfg, raw={}), tensors, attributes


# The common text-model fields, for walks over ``built``: field -> (another value, or a function of the config
# giving one; other changes that let it matter). (num_hidden_layers drops layer_types, which would pin the count.)
TEXT_MODEL_IMPLEMENTED = {
    "vocab_size": (100, {}),
    "hidden_size": (48, {}),
    "intermediate_size": (96, {}),
    "num_hidden_layers": (6, {"layer_types": None}),
    "num_attention_heads": (8, {}),
    "num_key_value_heads": (4, {}),
    "head_dim": (16, {}),
    "hidden_act": ("gelu", {}),
    "max_position_embeddings": (1024, {}),
    "rms_norm_eps": (3e-5, {}),
    "tie_word_embeddings": (lambda cfg: not cfg["tie_word_embeddings"], {}),
    "rope_parameters": (lambda cfg: {**cfg["rope_parameters"], "rope_theta": 5e4}, {}),
    "eos_token_id": (7, {}),
    "dtype": ("bfloat16", {}),
}


def walk_fields(
    label: str,
    cfg: dict,
    implemented: dict,
    irrelevant: set,
    change=lambda cfg, fields: {**cfg, **fields},
) -> None:
    """Every field of ``cfg`` (a config dict) is in ``implemented`` (another value changes what ``built``
    describes) or ``irrelevant`` (another value does not). ``change(cfg, fields)`` -> the config with ``fields``
    set (default: at the top level); ``label`` names the config in failures."""
    unknown = sorted(set(cfg) - set(implemented) - irrelevant - {"architectures"})
    assert not unknown, f"{label} fields nobody decided on: {unknown}"
    for name in sorted(set(cfg) & set(implemented)):
        value, context = implemented[name]
        value = value(cfg) if callable(value) else value
        before, after = change(cfg, context), change(cfg, {**context, name: value})
        assert built(before) != built(after), f"{label}.{name}={value!r} changes nothing"
    for name in sorted(set(cfg) & irrelevant):
        other = "changed" if cfg[name] is None or isinstance(cfg[name], str) else not cfg[name]
        assert built(change(cfg, {name: other})) == built(change(cfg, {})), f"{label}.{name}"
