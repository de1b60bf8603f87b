"""Step-3.5-Flash's config.json as models/step3p5.py reads it (``Step3p5Config``: the per-layer lists read into
one ``LayerSpec`` a layer, decoder layers then MTP layers), with every value outpace does not implement, or on
which vLLM and SGLang disagree, refused by name. The facts and their sources: models/step3p5.py's docstring."""

from __future__ import annotations

import re
from dataclasses import dataclass

from outpace.layers.router import Routing
from outpace.model_config import ModelConfig
from outpace.validation import ConfigError, is_finite_number, is_int

LAYER_TYPES = ("full_attention", "sliding_attention")

# What a config.json that omits a field (or gives it as null, as a typed read of config.json takes it:
# validation.py ``ConfigFields``) means: vLLM's Step3p5Config defaults (transformers_utils/configs/
# step3p5.py), or for the fields that class lacks, vLLM step3p5.py's getattr defaults (a default the code
# then refuses, such as the config class's softmax router activation, makes the field required).
DEFAULTS = dict(
    moe_num_experts=16,
    moe_top_k=4,
    moe_intermediate_size=10240,
    rope_theta=500000.0,
    moe_router_scaling_factor=1.0,
    norm_expert_weight=True,
    use_moe_router_bias=True,
    need_fp32_gate=True,
    use_head_wise_attn_gate=False,
    att_impl_type="GQA",
    use_rope_layers=None,
    yarn_only_types=None,
    attention_other_setting=None,
    partial_rotary_factors=None,
    swiglu_limits=None,
    swiglu_limits_shared=None,
    share_expert_dim=None,
    use_qk_norm=True,
    zero_centered=True,
    sink=False,
    attention_bias=False,
    moe_router_activation="softmax",
)
# the fields read as true or false (a string or a number there was taken as truthy, "false" included)
BOOLEANS = (
    "norm_expert_weight",
    "use_moe_router_bias",
    "need_fp32_gate",
    "use_head_wise_attn_gate",
    "use_qk_norm",
    "zero_centered",
    "sink",
    "attention_bias",
)


def refuse(name: str, value, allowed: str) -> ConfigError:
    return ConfigError(f"ModelConfig.{name}={value!r} is not supported: must be {allowed}")


@dataclass(frozen=True)
class LayerSpec:
    """One decoder layer's shape, read from the per-layer config lists at its index."""

    sliding_window: int | None  # None: full attention
    num_heads: int
    num_kv_heads: int
    rope_theta: float
    rotary_dim: int  # the leading dimensions of each head that RoPE rotates
    rope_scaling: dict | None
    moe: bool
    swiglu_limit: float | None  # routed experts' clamp (None: plain SwiGLU)
    swiglu_limit_shared: float | None  # the shared expert's and the dense MLP's clamp


@dataclass(frozen=True)
class Step3p5Config:
    """What a Step3p5 model reads from config.json beyond ``ModelConfig``; ``layers`` covers the decoder
    layers and then the MTP layers (indices num_hidden_layers ..)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    rms_norm_eps: float
    head_dim: int
    max_position_embeddings: int
    head_wise_gate: bool
    moe_intermediate_size: int
    share_expert_dim: int
    routing: Routing
    layers: tuple[LayerSpec, ...]

    @classmethod
    def from_model_config(cfg_cls, cfg: ModelConfig) -> Step3p5Config:
        raw = {**DEFAULTS, **{k: v for k, v in cfg.raw.items() if v is not None}}
        _refuse_unimplemented(raw, cfg)
        total = cfg.num_hidden_layers + cfg.num_nextn_predict_layers
        experts, top_k = raw["moe_num_experts"], raw["moe_top_k"]
        return cfg_cls(
            vocab_size=cfg.vocab_size,
            hidden_size=cfg.hidden_size,
            intermediate_size=cfg.intermediate_size,
            num_hidden_layers=cfg.num_hidden_layers,
            rms_norm_eps=cfg.rms_norm_eps,
            head_dim=cfg.head_dim,
            max_position_embeddings=cfg.max_position_embeddings,
            head_wise_gate=bool(raw["use_head_wise_attn_gate"]),
            moe_intermediate_size=raw["moe_intermediate_size"],
            # vLLM Step3p5Config: share_expert_dim defaults to moe_intermediate_size * moe_top_k
            share_expert_dim=raw["share_expert_dim"] or raw["moe_intermediate_size"] * top_k,
            routing=Routing(
                num_experts=experts,
                top_k=top_k,
                scoring="sigmoid",
                correction_bias=True,
                normalize=True,
                scaling=float(raw["moe_router_scaling_factor"]),
            ),
            layers=tuple(_layer_spec(raw, cfg, i) for i in range(total)),
        )


def _per_layer(raw: dict, name: str, index: int, default):
    values = raw[name]
    return default if not values else values[index]


def _limit(raw: dict, name: str, index: int) -> float | None:
    """A SwiGLU clamp: None or 0 mean none (vLLM: ``not in (None, 0)``; SGLang: ``> 0``)."""
    value = _per_layer(raw, name, index, None)
    return float(value) if value else None


def _moe_layers(raw: dict) -> set[int]:
    """moe_layers_enum: "3,4,...,44" (the released config), or a list of indices (``_check_types``)."""
    value = raw["moe_layers_enum"]
    if isinstance(value, str):
        return {int(i) for i in value.split(",") if i.strip()}
    return set(value)


def _layer_spec(raw: dict, cfg: ModelConfig, i: int) -> LayerSpec:
    kind = raw["layer_types"][i]
    sliding = kind == "sliding_attention"
    other = raw["attention_other_setting"] or {}
    theta, yarn_only = raw["rope_theta"], raw["yarn_only_types"]
    return LayerSpec(
        sliding_window=raw["sliding_window"] if sliding else None,
        num_heads=other.get("num_attention_heads", cfg.num_attention_heads)
        if sliding
        else cfg.num_attention_heads,
        num_kv_heads=other.get("num_attention_groups", cfg.num_key_value_heads)
        if sliding
        else cfg.num_key_value_heads,
        rope_theta=float(theta[i] if isinstance(theta, list) else theta),
        rotary_dim=int(cfg.head_dim * _per_layer(raw, "partial_rotary_factors", i, 1.0)),
        rope_scaling=cfg.rope_scaling if yarn_only and kind in yarn_only else None,
        moe=i in _moe_layers(raw),
        swiglu_limit=_limit(raw, "swiglu_limits", i),
        swiglu_limit_shared=_limit(raw, "swiglu_limits_shared", i),
    )


def _refuse_unimplemented(raw: dict, cfg: ModelConfig) -> None:
    """ConfigError for Step3p5 config values that change the computation and that outpace does not implement,
    or on which vLLM and SGLang disagree (``raw``: defaults filled in)."""
    total = cfg.num_hidden_layers + cfg.num_nextn_predict_layers
    _check_types(raw, total)
    for name, value, why in (
        ("use_qk_norm", True, "both references always apply the per-head q/k norms"),
        ("zero_centered", True, "both references build every norm as GemmaRMSNorm"),
        ("need_fp32_gate", True, "vLLM asserts it; the router runs in float32"),
        ("att_impl_type", "GQA", "vLLM raises for any other"),
        (
            "moe_router_activation",
            "sigmoid",
            "SGLang routes with sigmoid only; vLLM's config class defaults "
            "to softmax, so the field must be given",
        ),
    ):
        if raw[name] != value:
            raise refuse(name, raw[name], f"{value!r} ({why})")
    if not raw[
        "use_moe_router_bias"
    ]:  # vLLM asserts it; SGLang's TopK reads a router_bias it then lacks
        raise refuse("use_moe_router_bias", raw["use_moe_router_bias"], "true")
    if not raw["norm_expert_weight"]:  # vLLM renormalises only with it, SGLang always
        raise refuse(
            "norm_expert_weight", raw["norm_expert_weight"], "true (SGLang always renormalises)"
        )
    if raw[
        "sink"
    ]:  # neither reference reads it: attention sinks are not implemented anywhere we can check
        raise refuse("sink", raw["sink"], "false (attention sinks are not implemented)")
    if raw["attention_bias"]:  # vLLM: biases on q/k/v; SGLang: none
        raise refuse(
            "attention_bias",
            raw["attention_bias"],
            "false (the references disagree on what true means)",
        )
    if cfg.tie_word_embeddings:
        raise refuse(
            "tie_word_embeddings", True, "false (SGLang unties the head, vLLM never ties it)"
        )
    if cfg.hidden_act != "silu":  # vLLM Step3p5MLP raises for anything else; SGLang always SiLU
        raise refuse("hidden_act", cfg.hidden_act, "'silu'")
    if "scale_emb" in raw:  # SGLang multiplies the embedding by it, vLLM does not
        raise refuse("scale_emb", raw["scale_emb"], "absent (the references disagree on it)")
    types = raw.get("layer_types")
    if not (
        isinstance(types, list) and len(types) >= total and set(types[:total]) <= set(LAYER_TYPES)
    ):
        raise refuse(
            "layer_types",
            types,
            f"a list of at least num_hidden_layers + num_nextn_predict_layers = "
            f"{total} entries of {' or '.join(LAYER_TYPES)} (vLLM and SGLang "
            "index it by layer, MTP layers included)",
        )
    if "sliding_attention" in types[:total]:
        window = raw.get("sliding_window")
        if not (isinstance(window, int) and not isinstance(window, bool) and window > 0):
            raise refuse(
                "sliding_window", window, "a positive integer (the model has sliding layers)"
            )
    _check_attention_other_setting(raw, cfg)
    _check_rope(raw, cfg, total)
    _check_moe(raw, total)


def _is_list_of(value, ok, total: int) -> bool:
    """A list of at least ``total`` entries (one per layer, MTP layers included) of which those ``total``
    pass ``ok``."""
    return isinstance(value, list) and len(value) >= total and all(ok(v) for v in value[:total])


def _check_types(raw: dict, total: int) -> None:
    """The types of the fields read beyond ModelConfig's, each refused by name: before, a string or a null
    in a per-layer list met float() or a comparison as a bare TypeError or ValueError, or was read as
    truthy (``bool("x")``, a string of layer types matched by substring)."""
    for name in BOOLEANS:
        if not isinstance(raw[name], bool):
            raise refuse(name, raw[name], "true or false")
    for name in ("moe_num_experts", "moe_top_k", "moe_intermediate_size"):
        if not (is_int(raw[name]) and raw[name] > 0):
            raise refuse(name, raw[name], "a positive integer")
    share = raw["share_expert_dim"]
    if not (share is None or is_int(share) and share > 0):
        raise refuse(
            "share_expert_dim",
            share,
            "None or a positive integer (None: moe_intermediate_size * moe_top_k)",
        )
    scale = raw["moe_router_scaling_factor"]
    if not (is_finite_number(scale) and scale > 0):
        raise refuse("moe_router_scaling_factor", scale, "a number > 0")
    layers = raw.get("moe_layers_enum")
    if isinstance(layers, str):
        ok = all(re.fullmatch(r"\s*-?[0-9]+\s*", i) for i in layers.split(",") if i.strip())
    else:
        ok = layers is None or isinstance(layers, list) and all(is_int(i) for i in layers)
    if not ok:
        raise refuse(
            "moe_layers_enum",
            layers,
            'layer indices: a string such as "1,2,4" or a list of integers',
        )
    theta = raw["rope_theta"]
    if not (
        is_finite_number(theta)
        and theta > 0
        or _is_list_of(theta, lambda t: is_finite_number(t) and t > 0, total)
    ):
        raise refuse(
            "rope_theta",
            theta,
            f"a number > 0 or a list of at least {total} numbers > 0, one per layer",
        )
    factors = raw["partial_rotary_factors"]
    if factors and not _is_list_of(factors, lambda f: is_finite_number(f) and 0 < f <= 1, total):
        raise refuse(
            "partial_rotary_factors",
            factors,
            f"empty or a list of at least {total} factors in (0, 1], one per layer",
        )
    for name in ("swiglu_limits", "swiglu_limits_shared"):
        values = raw[name]
        if values and not _is_list_of(
            values, lambda v: v is None or is_finite_number(v) and v >= 0, total
        ):
            raise refuse(
                name,
                values,
                f"empty or a list of at least {total} limits, each None or a number >= 0",
            )
    use_rope = raw["use_rope_layers"]
    if use_rope and not _is_list_of(use_rope, lambda u: isinstance(u, bool), total):
        raise refuse(
            "use_rope_layers",
            use_rope,
            f"empty or a list of at least {total} true or false entries",
        )
    yarn_only = raw["yarn_only_types"]
    if yarn_only and not (isinstance(yarn_only, list) and all(t in LAYER_TYPES for t in yarn_only)):
        raise refuse(
            "yarn_only_types",
            yarn_only,
            f"empty or a list of layer types ({', '.join(LAYER_TYPES)})",
        )


def _check_attention_other_setting(raw: dict, cfg: ModelConfig) -> None:
    """Its attention_type, num_attention_heads, num_attention_groups and head_dim; other keys are read by
    neither reference."""
    other = raw["attention_other_setting"]
    if other is None:
        return
    if not isinstance(other, dict):
        raise refuse("attention_other_setting", other, "a dict or absent")
    # vLLM uses these heads on the layers of type attention_type, SGLang on the sliding layers
    if other.get("attention_type", "sliding_attention") != "sliding_attention":
        raise refuse(
            "attention_other_setting.attention_type", other["attention_type"], "'sliding_attention'"
        )
    if other.get("head_dim", cfg.head_dim) != cfg.head_dim:  # vLLM reads it, SGLang uses head_dim
        raise refuse(
            "attention_other_setting.head_dim", other["head_dim"], f"head_dim={cfg.head_dim}"
        )
    heads = other.get("num_attention_heads", cfg.num_attention_heads)
    kv = other.get("num_attention_groups", cfg.num_key_value_heads)
    if not (is_int(heads) and is_int(kv) and 0 < kv and 0 < heads and heads % kv == 0):
        raise refuse(
            "attention_other_setting",
            other,
            "num_attention_heads a multiple of num_attention_groups",
        )


def _check_rope(raw: dict, cfg: ModelConfig, total: int) -> None:
    factors = raw["partial_rotary_factors"]  # (rope_theta's and their types: _check_types)
    if factors and not all(int(cfg.head_dim * f) % 2 == 0 for f in factors[:total]):
        raise refuse(
            "partial_rotary_factors",
            factors,
            f"a list of at least {total} factors in (0, 1], each rotating an even number of dimensions",
        )
    use_rope = raw["use_rope_layers"]
    if use_rope and not all(
        use_rope[:total]
    ):  # vLLM skips RoPE on the false layers, SGLang rotates every layer
        raise refuse(
            "use_rope_layers",
            use_rope,
            "empty or all true (the references disagree on false entries)",
        )
    yarn_only = raw["yarn_only_types"]
    if cfg.rope_scaling is not None and not yarn_only:
        # vLLM scales every layer without yarn_only_types, SGLang none
        raise refuse(
            "yarn_only_types", yarn_only, "a non-empty list of layer types when rope_scaling is set"
        )


def _check_moe(raw: dict, total: int) -> None:
    if (
        raw.get("moe_layers_enum") is None
    ):  # vLLM: MoE from layer 1 on; SGLang cannot load without it
        raise refuse(
            "moe_layers_enum",
            None,
            "the MoE layers' indices (the references disagree on its absence)",
        )
    experts, top_k = raw.get("moe_num_experts"), raw.get("moe_top_k")
    if _moe_layers(raw) & set(range(total)):
        if not top_k <= experts:  # (types: _check_types)
            raise refuse("moe_top_k", top_k, f"an integer in [1, moe_num_experts={experts}]")


# ---- layers ------------------------------------------------------------------------------------------------
