"""The model's configuration: the parts of a Hugging Face ``config.json`` that outpace's models read.

``ModelConfig.from_dict`` reads the fields of transformers' common layout (``COMMON_FIELDS``); what a
family reads otherwise (its own field names, biases, per-layer sliding windows) its model class says
through the hooks of outpace/models/config_hooks.py, found by architecture in outpace/registry.py. No
family is named here.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from outpace.layers.quant.scheme import QuantScheme, parse_quantization_config, read_quant_scheme
from outpace.registry import MODELS, TEXT_MODEL_VARIANTS, model_class
from outpace.validation import (
    INT64_MAX,
    ConfigError,
    ConfigFields,
    is_finite_number,
    is_int,
    read_json_object,
    require,
    require_positive_int,
)

SUPPORTED_ARCHITECTURES = tuple(MODELS)  # the one list of architectures is the registry's

# the rope_type values layers/rotary.py implements
ROPE_TYPES = ("default", "llama3", "linear", "yarn")


# The sizes every decoder config gives, positive integers
SIZE_FIELDS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "max_position_embeddings",
)


@dataclass(frozen=True)
class ModelConfig:
    """The parts of a Hugging Face ``config.json`` that outpace's models read."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    # Ministral 3's query temperature (rope_parameters' llama_4_scaling_beta, original_max_position_embeddings):
    # layers/rotary.py ``query_scales``; None without it
    query_scaling: tuple[float, int] | None = None
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # biases on q_proj, k_proj, v_proj
    attention_out_bias: bool = False  # a bias on o_proj
    mlp_bias: bool = False  # biases on gate_proj, up_proj, down_proj
    hidden_act: str = (
        "silu"  # the MLP's gate activation: a key of layers/activation.py's ACTIVATIONS
    )
    qk_norm: bool = False
    # Per decoder layer: its sliding attention window (None: full attention); () when every layer is full.
    layer_windows: tuple[int | None, ...] = ()
    torch_dtype: str = "float32"
    eos_token_ids: tuple[int, ...] = ()
    # Multi-token-prediction layers stored after the decoder layers (DeepSeek-V3 layout).
    num_nextn_predict_layers: int = 0
    # Chain-style MTP (Step-3.5-Flash): layer k consumes layer k-1's pre-norm hidden state.
    chain_mtp_hidden_states: bool = False
    # How the checkpoint's weights are quantized (layers/quant/scheme.py); None: unquantized.
    quantization: QuantScheme | None = None
    raw: dict = field(default_factory=dict, repr=False, compare=False)
    # The config.json it was read from (its path), which the errors of checks run while the model is built name
    # (``naming_file``); not part of what the config is.
    source: str = field(default="config.json", repr=False, compare=False)

    def __post_init__(self) -> None:
        o = "ModelConfig"
        require(
            o,
            "architecture",
            self.architecture,
            self.architecture in SUPPORTED_ARCHITECTURES,
            f"one of {', '.join(SUPPORTED_ARCHITECTURES)}",
        )
        for name in SIZE_FIELDS:
            require_positive_int(o, name, getattr(self, name))
        require(
            o,
            "num_key_value_heads",
            self.num_key_value_heads,
            self.num_attention_heads % self.num_key_value_heads == 0,
            f"a divisor of num_attention_heads={self.num_attention_heads}",
        )
        eps = self.rms_norm_eps
        require(o, "rms_norm_eps", eps, is_finite_number(eps) and 0 < eps < 1, "in (0, 1)")
        theta = self.rope_theta
        require(o, "rope_theta", theta, is_finite_number(theta) and theta > 0, "a number > 0")
        require(
            o,
            "torch_dtype",
            self.torch_dtype,
            self.torch_dtype in ("float32", "float16", "bfloat16"),
            "one of float32, float16, bfloat16",
        )
        require(
            o,
            "num_nextn_predict_layers",
            self.num_nextn_predict_layers,
            is_int(self.num_nextn_predict_layers) and self.num_nextn_predict_layers >= 0,
            "an integer >= 0",
        )
        if self.rope_scaling is not None:
            kind = self.rope_scaling.get("rope_type", self.rope_scaling.get("type"))
            require(
                o,
                "rope_scaling.rope_type",
                kind,
                kind in ROPE_TYPES,
                f"one of {', '.join(ROPE_TYPES)}",
            )
            # transformers _compute_yarn_parameters reads both
            for key in ("factor", "original_max_position_embeddings") if kind == "yarn" else ():
                value = self.rope_scaling.get(key)
                require(
                    o,
                    f"rope_scaling.{key}",
                    value,
                    is_finite_number(value) and value > 0,
                    "a number > 0 for YaRN",
                )
        # NOTE: imported here so that importing this module does not import torch (the CLI's parser).
        from outpace.layers.activation import ACTIVATIONS

        require(
            o,
            "hidden_act",
            self.hidden_act,
            self.hidden_act in ACTIVATIONS,
            f"one of {', '.join(ACTIVATIONS)} (activations with learned parameters are not implemented)",
        )
        require(
            o,
            "layer_windows",
            self.layer_windows,
            len(self.layer_windows) in (0, self.num_hidden_layers)
            and all(w is None or (isinstance(w, int) and w > 0) for w in self.layer_windows),
            f"empty or {self.num_hidden_layers} entries, each None or a positive integer",
        )

    def layer_window(self, layer: int) -> int | None:
        """Decoder layer ``layer``'s sliding attention window: a query at position p sees the keys at
        positions p - window + 1 .. p; None means full causal attention."""
        return self.layer_windows[layer] if self.layer_windows else None

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim

    def naming_file(self) -> contextlib.AbstractContextManager[None]:
        """Where a model is built from this config (its class's constructor, models/config_hooks.py
        ``ConfigHooks``): a ``ConfigError`` that its family's checks raise names ``source``, the config.json, as
        those run while it is parsed do."""
        return errors_name_file(self.source)

    @classmethod
    def from_dict(cls, cfg: dict, source: str = "config.json") -> ModelConfig:
        """``cfg``: the config.json object; ``source`` names it in errors (its path)."""
        with errors_name_file(source):
            return cls._from_dict(cfg, source)

    @classmethod
    def _from_dict(cls, cfg: dict, source: str) -> ModelConfig:
        if not isinstance(cfg, dict):
            raise ConfigError(f"{source}: must hold a JSON object, got a {type(cfg).__name__}")
        arch = _architecture(ConfigFields(cfg, source))
        fields = ConfigFields(_text_model_config(cfg), source)
        family = model_class(arch)
        # what the family's transformers config class gives the fields the file leaves out, read as if it gave them
        defaults = family.config_defaults(fields)
        if defaults:
            fields = ConfigFields({**fields.data, **defaults}, source)
        _refuse_unimplemented(family, arch, fields)
        values = family.config_overrides(fields)
        for name, read in COMMON_FIELDS.items():
            if name not in values:
                values[name] = read(fields, values)
        quantization = fields.get("quantization_config")
        cfg = cls(
            architecture=arch,
            **values,
            layer_windows=family.layer_windows(fields, values["num_hidden_layers"]),
            quantization=None
            if quantization is None
            else parse_quantization_config(quantization, source),
            raw=fields.data,
            source=source,
        )
        # the tables of layers/rotary.py span head_dim (a partial rotary family checks the width it rotates)
        if cfg.head_dim % 2 and not family.partial_rotary:
            raise fields.fail("head_dim", cfg.head_dim, "even (RoPE rotates pairs of dimensions)")
        return cfg

    @classmethod
    def from_pretrained(cls, model_dir: str | Path) -> ModelConfig:
        path = Path(model_dir) / "config.json"
        if not path.is_file():
            raise ConfigError(f"no config.json in model directory {str(model_dir)!r}")
        cfg = cls.from_dict(read_json_object(path), str(path))
        if cfg.quantization is None:  # ModelOpt's hf_quant_config.json beside config.json
            scheme = read_quant_scheme(model_dir, None, str(path))
            if scheme is not None:
                cfg = dataclasses.replace(cfg, quantization=scheme)
        return cfg


@contextlib.contextmanager
def errors_name_file(source: str) -> Iterator[None]:
    """A ``ConfigError`` raised inside starts with ``source`` (a config.json path): the checks that name the
    field alone (``require``: ``ModelConfig.field=value ...``) get the file named too; one that names it already
    is left as it is."""
    try:
        yield
    except ConfigError as e:
        if str(e).startswith(f"{source}:"):
            raise
        raise ConfigError(f"{source}: {e}") from None


def _architecture(fields: ConfigFields) -> str:
    """The first of ``architectures`` (else ``model_type``), one the registry knows; for a multimodal one whose
    text model follows text_config's model_type, the registry's name of that pairing (``TEXT_MODEL_VARIANTS``)."""
    archs = fields.get("architectures") or [fields.string("model_type", "<missing>")]
    if not (isinstance(archs, list) and all(isinstance(a, str) for a in archs)):
        raise fields.fail("architectures", archs, "a list of class names")
    if archs[0] not in SUPPORTED_ARCHITECTURES:
        raise ConfigError(
            f"{fields.source}: architecture {archs[0]!r} is not supported: must be one of "
            f"{', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    text = fields.get("text_config")
    text_type = text.get("model_type") if isinstance(text, dict) else None
    return TEXT_MODEL_VARIANTS.get((archs[0], text_type), archs[0])


def _rope_parameters(fields: ConfigFields) -> ConfigFields | None:
    """Where transformers 5 reads RoPE (PreTrainedConfig.convert_rope_params_to_dict): rope_scaling,
    the older name, else rope_parameters; a top-level rope_theta only fills in a theta they lack."""
    for key in ("rope_scaling", "rope_parameters"):
        params = fields.mapping(key)
        if params is not None and params.data:
            return params
    return None


def _rope_theta(fields: ConfigFields) -> float:
    params = _rope_parameters(fields)
    if params is not None and "rope_theta" in params:
        return float(params.number("rope_theta", positive=True))
    return float(fields.number("rope_theta", 10000.0, positive=True))


# rope_type -> the numbers > 0 that layers/rotary.py reads without a default (transformers validate_rope requires
# them too)
ROPE_FACTORS = {
    "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor"),
    "yarn": ("factor",),
}
# YaRN's optional numbers (transformers _compute_yarn_parameters; a beta of 0 is its default, 32 or 1)
YARN_NUMBERS = ("beta_fast", "beta_slow", "mscale", "mscale_all_dim", "attention_factor")


def _rope_scaling(fields: ConfigFields, max_positions: int) -> dict | None:
    """The rope_parameters dict when its rope_type is not the default (__post_init__ checks the rope_type), the
    fields layers/rotary.py reads checked. llama3's and yarn's ``original_max_position_embeddings`` is, as
    transformers standardize_rope_params gives it, a top-level one where the config has it (Phi-3's layout, which
    overrides the one in rope_parameters), else rope_parameters', else ``max_positions``."""
    params = _rope_parameters(fields)
    if params is None:
        return None
    kind = params.string("rope_type" if "rope_type" in params else "type", "default")
    if kind == "default":
        return None
    for key in ROPE_FACTORS.get(kind, ()):
        params.number(key, positive=True)
    for key in YARN_NUMBERS if kind == "yarn" else ():
        value = params.number(key, None)
        if key.startswith("beta") and value is not None and value < 0:
            raise params.fail(key, value, "a number >= 0")
    if kind not in ("llama3", "yarn"):
        return params.data
    length = fields.number("original_max_position_embeddings", None, positive=True)
    if length is None:
        length = params.number("original_max_position_embeddings", max_positions, positive=True)
    return {**params.data, "original_max_position_embeddings": length}


def _query_scaling(fields: ConfigFields) -> tuple[float, int] | None:
    """rope_parameters' ``llama_4_scaling_beta`` and the ``original_max_position_embeddings`` that
    transformers' Ministral3Attention divides positions by; None where the config has no beta."""
    params = _rope_parameters(fields)
    if params is None or params.get("llama_4_scaling_beta") is None:
        return None
    beta = float(params.number("llama_4_scaling_beta"))
    # the length of llama3 and yarn is a top-level one where the config has it (``_rope_scaling``)
    kind = params.get("rope_type", params.get("type"))
    top = kind in ("llama3", "yarn") and fields.get("original_max_position_embeddings") is not None
    return beta, (fields if top else params).integer("original_max_position_embeddings", minimum=1)


def eos_token_ids_of(fields: ConfigFields) -> tuple[int, ...]:
    """``eos_token_id`` of a config.json or generation_config.json: an id or a list of them."""
    eos = fields.get("eos_token_id")
    if eos is None or isinstance(eos, list):
        return tuple(fields.integers("eos_token_id") or ())
    return (fields.integer("eos_token_id", minimum=0, maximum=INT64_MAX),)


def _torch_dtype(fields: ConfigFields) -> str:
    return fields.string("torch_dtype", None) or fields.string("dtype", None) or "float32"


# ModelConfig field -> how transformers' common config.json layout gives it, from the config and the
# fields read before it (in this order). A family's ``config_overrides`` replaces any of them; its
# ``config_defaults`` replace the defaults here with its transformers config class's.
COMMON_FIELDS: dict[str, Callable[[ConfigFields, dict[str, Any]], Any]] = {
    "vocab_size": lambda f, _: f.integer("vocab_size"),
    "hidden_size": lambda f, _: f.integer("hidden_size"),
    "intermediate_size": lambda f, _: f.integer("intermediate_size"),
    "num_hidden_layers": lambda f, _: f.integer("num_hidden_layers"),
    "num_attention_heads": lambda f, _: f.integer("num_attention_heads"),
    "num_key_value_heads": lambda f, read: f.integer(
        "num_key_value_heads", read["num_attention_heads"]
    ),
    "head_dim": lambda f, read: f.integer(
        "head_dim", read["hidden_size"] // read["num_attention_heads"]
    ),
    "max_position_embeddings": lambda f, _: f.integer("max_position_embeddings", 4096),
    "rms_norm_eps": lambda f, _: float(f.number("rms_norm_eps", 1e-6, positive=True)),
    "rope_theta": lambda f, _: _rope_theta(f),
    "rope_scaling": lambda f, read: _rope_scaling(f, read["max_position_embeddings"]),
    "query_scaling": lambda f, _: _query_scaling(f),
    "tie_word_embeddings": lambda f, _: f.boolean("tie_word_embeddings", False),
    "hidden_act": lambda f, _: f.string("hidden_act", "silu"),
    "torch_dtype": lambda f, _: _torch_dtype(f),
    "eos_token_ids": lambda f, _: eos_token_ids_of(f),
    "num_nextn_predict_layers": lambda f, _: f.integer("num_nextn_predict_layers", 0, minimum=0),
    "chain_mtp_hidden_states": lambda f, _: f.boolean("chain_mtp_hidden_states", False),
}


def _refuse_unimplemented(family: type, arch: str, fields: ConfigFields) -> None:
    """Refuse config.json entries outside the family's own fields that would change what the model
    computes and that outpace does not implement."""
    # transformers 5 (RotaryEmbeddingConfigMixin.convert_rope_params_to_dict) moves a top-level
    # partial_rotary_factor into rope_parameters where they lack one: refused as one there would be.
    top = fields.number("partial_rotary_factor", 1.0, positive=True)
    if top != 1.0 and not (family.partial_rotary or family.own_partial_rotary_factor):
        raise fields.fail(
            "partial_rotary_factor",
            top,
            f"1.0 (partial rotary embeddings are not implemented for {arch})",
        )
    for key in ("rope_parameters", "rope_scaling"):
        rope = fields.mapping(key)
        if rope is None:
            continue
        # transformers modeling_rope_utils: rotate only int(head_dim * partial_rotary_factor) dimensions.
        factor = rope.number("partial_rotary_factor", 1.0, positive=True)
        if not (factor == 1.0 or family.partial_rotary):
            raise rope.fail(
                "partial_rotary_factor",
                factor,
                f"1.0 (partial rotary embeddings are not implemented for {arch})",
            )
        beta = rope.get("llama_4_scaling_beta")
        if not (beta is None or family.query_scaling):
            raise rope.fail(
                "llama_4_scaling_beta",
                beta,
                f"absent (Ministral 3's query scaling is not implemented for {arch})",
            )


def _text_model_config(cfg: dict) -> dict:
    """A multimodal checkpoint's config.json (a ForConditionalGeneration with a ``text_config``) -> its
    text model's config, with the top level's architectures, eos ids, dtype, quantization and tying where
    it gives them (transformers ties a Gemma3ForConditionalGeneration's head by the top level's
    tie_word_embeddings). Any other config as it is."""
    if not isinstance(cfg.get("text_config"), dict):
        return cfg
    top = (
        "architectures",
        "eos_token_id",
        "dtype",
        "torch_dtype",
        "quantization_config",
        "tie_word_embeddings",
    )
    return {**cfg["text_config"], **{k: cfg[k] for k in top if cfg.get(k) is not None}}
