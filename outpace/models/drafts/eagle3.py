"""EAGLE3 draft model in the formats of public EAGLE3 checkpoints: the native one
(``LlamaForCausalLMEagle3``: the EAGLE-3 release, SGLang/SpecForge; ``model.safetensors`` or
``pytorch_model.bin``) and vLLM's speculators format (``speculators_model_type: "eagle3"``).

One decoder layer over ``concat(input_layernorm(embed(token t+1)), hidden_norm(g_t))`` where g_t is
``fc(concat(aux hidden states of the target at t))`` for rows the target computed, or the draft's
own previous pre-norm output for rows it drafted. The layer's residual stream is g_t, or
``hidden_norm(g_t)`` with ``norm_before_residual`` (speculators' Eagle3DecoderLayer and vLLM's
llama_eagle3.py ``_norm_before_residual``). Then ``norm`` and ``lm_head`` over a draft vocabulary;
draft id i is target id ``i + d2t[i]``. Checkpoint tensors: ``fc.weight``, optional
``fc_norm.{i}.weight`` (per-aux RMSNorm, "aux norm", enabled by ``use_aux_norm`` or ``fc_norm`` in
the config; SpecForge's Gemma training names them ``aux_norm_{low,mid,high}.weight``, sgl-project/SpecForge
pull 553 specforge/modeling/draft/llama3_eagle.py, which SGLang's llama_eagle3.py load_weights maps to
``fc_norm.{0,1,2}``), the layer's ``{input_layernorm,hidden_norm,self_attn.*,post_attention_layernorm,mlp.*}``
under ``midlayer.`` (native) or ``layers.0.`` (speculators; vLLM's loader renames ``midlayer.`` to
``layers.0.``), ``norm.weight``, ``lm_head.weight``, ``d2t``, ``t2d`` and optionally
``embed_tokens.weight``. The embedding and, when the draft has none, the head come from the target.

The embedding the draft reads: the raw table's rows times ``embed_scale``. SpecForge's Gemma EAGLE3
training (pull 553, llama3_eagle.py ``embed_input_ids``) multiplies the raw target table by
``embed_scale`` from the config, or by sqrt(hidden_size) when ``target_model_type`` names a Gemma
model, else by 1; so the public Gemma drafts expect the *scaled* lookup Gemma uses itself (SGLang
serving hands the draft the raw table, get_embed in gemma3_causal.py, and the two differ only through
the norm's eps: the layer normalises the embedding first). The scale is folded into that norm's eps
(RMSNorm(s x, eps) = RMSNorm(x, eps / s^2)), so the raw table serves both the eager and the fused path.

Speculators config (vLLM transformers_utils/configs/speculators/{base,algos}.py; speculators
models/eagle3/config.py): the layer's shapes are the ``transformer_layer_config`` dict (a
transformers config's ``to_diff_dict()``, so class defaults may be left out; its ``vocab_size`` is
the target's); ``draft_vocab_size``, ``target_hidden_size`` (null: the layer's hidden size),
``norm_before_residual`` (required: its readers' defaults disagree), ``fc_norm``,
``eagle_aux_hidden_state_layer_ids`` sit at the top level; ``speculators_config`` holds
``proposal_methods`` (``speculative_tokens``) and ``verifier`` (``name_or_path``), which describe
serving, not the weights, as ``embed_requires_grad`` and ``enable_sp_ulysses`` describe training.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from outpace.checkpoint import (
    checkpoint_files,
    checkpoint_tensor_names,
    load_checkpoint,
    open_shard,
)
from outpace.layers.decoder import DecoderAttention, GatedMLP
from outpace.layers.embedding import LMHead, VocabEmbedding, vocab_shard_of
from outpace.layers.fused_decoder import (
    attention_and_mlp,
    embed_norm_pair,
    head_argmax_tokens,
    layer_fuses,
    norm_head_logits,
)
from outpace.layers.linear import linear
from outpace.layers.norm import RMSNorm
from outpace.layers.quant.scheme import MODELOPT_CONFIG_FILE
from outpace.model_config import SIZE_FIELDS, ModelConfig, errors_name_file
from outpace.models.drafts.eagle3_aux_ids import FIRST_ID_RULE, AuxIdConvention
from outpace.models.llama import build_rotary
from outpace.models.loader import covering_positions, default_dtype
from outpace.validation import ConfigError, ConfigFields, read_json_object

# The integer dtypes a token map (d2t, t2d) may be stored in
INTEGER_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)
# SpecForge's names of the three aux norms (pull 553 llama3_eagle.py), in the order of the aux states
AUX_NORM_NAMES_SPECFORGE = ("aux_norm_low", "aux_norm_mid", "aux_norm_high")


class DraftMismatchError(ValueError):
    """A draft does not fit the target it is loaded against."""


@dataclass(frozen=True)
class Eagle3Config:
    layer: ModelConfig  # shapes of the decoder layer (vocab_size is the target's)
    draft_vocab_size: int
    target_hidden_size: int
    aux_layer_ids: tuple[int, ...] | None  # as written in the checkpoint (see capture_layer_ids)
    use_aux_norm: bool = False
    bias: bool = False
    norm_before_residual: bool = False
    embed_scale: float = 1.0  # the draft reads the target's table rows times this

    @classmethod
    def from_dict(cls, cfg: dict, source: str = "config.json") -> Eagle3Config:
        """A native config, or a speculators one (``speculators_model_type``); every ``ConfigError`` names
        ``source`` (its path) and the field."""
        with errors_name_file(source):
            return cls._from_dict(cfg, source)

    @classmethod
    def _from_dict(cls, cfg: dict, source: str) -> Eagle3Config:
        if "speculators_model_type" in cfg:
            cfg = _flatten_speculators(ConfigFields(cfg, source))
        else:
            _refuse_architecture(ConfigFields(cfg, source))
        fields = ConfigFields(cfg, source)
        # NOTE: one decoder layer, as SGLang's and vLLM's LlamaForCausalLMEagle3 (which refuse any other count)
        layers = fields.integer("num_hidden_layers", 1)
        if layers != 1:
            raise fields.fail(
                "num_hidden_layers", layers, "1 (an EAGLE3 draft is one decoder layer)"
            )
        _refuse_unimplemented(fields)
        layer = ModelConfig.from_dict(
            {**cfg, "architectures": ["LlamaForCausalLM"], "num_hidden_layers": 1}, source
        )
        return cls(
            layer=layer,
            draft_vocab_size=fields.integer("draft_vocab_size", layer.vocab_size),
            target_hidden_size=fields.integer("target_hidden_size", layer.hidden_size),
            aux_layer_ids=_aux_layer_ids(fields),
            use_aux_norm=any([fields.boolean(k, False) for k in ("use_aux_norm", "fc_norm")]),
            bias=fields.boolean("bias", False),
            norm_before_residual=fields.boolean("norm_before_residual", False),
            embed_scale=_embed_scale(cfg, source),
        )

    @property
    def num_aux(self) -> int:
        return len(self.aux_layer_ids) if self.aux_layer_ids else 3

    def capture_layer_ids(
        self, num_target_layers: int, convention: AuxIdConvention = FIRST_ID_RULE
    ) -> tuple[int, ...]:
        """The target layers whose *inputs* to capture (index num_target_layers: the last output), as
        the target family's ``convention`` reads the checkpoint's ids (models/drafts/eagle3_aux_ids.py)."""
        return convention.capture_ids(self.aux_layer_ids, num_target_layers)


def target_capture_ids(cfg: Eagle3Config, target: nn.Module) -> tuple[int, ...]:
    """The capture ids of ``cfg`` on ``target``: families whose drafts write their ids otherwise than the
    first-id rule declare their ``eagle3_aux_ids`` convention (Gemma)."""
    return cfg.capture_layer_ids(
        target.config.num_hidden_layers, getattr(target, "eagle3_aux_ids", FIRST_ID_RULE)
    )


def _aux_layer_ids(fields: ConfigFields) -> tuple[int, ...] | None:
    """eagle_config's eagle_aux_hidden_state_layer_ids, else the top level's; None when absent or empty."""
    eagle, key = fields.mapping("eagle_config"), "eagle_aux_hidden_state_layer_ids"
    ids = eagle.integers(key) if eagle is not None and key in eagle else fields.integers(key)
    return tuple(ids) if ids else None


# The EAGLE3 drafts whose network is ``Eagle3Layer`` (one Llama decoder layer), by their ``architectures``: SGLang's
# models/llama_eagle3.py and SpecForge's modeling/auto.py (AutoDraftModelConfig) name it LlamaForCausalLMEagle3,
# vLLM's models/llama_eagle3.py Eagle3LlamaForCausalLM, and SGLang's configs/model_config.py renames a draft's
# LlamaForCausalLM to LlamaForCausalLMEagle3. Other names are other networks (SpecForge's configs/
# qwen3-30B-A3B-eagle3-moe-draft.json Qwen3MoEForCausalLMEagle3 and gpt-oss-20B-eagle3.json GptOssForCausalLMEagle3:
# MoE layers; its Qwen2_5_VLForCausalLMEagle3: M-RoPE), refused rather than read as this one.
LLAMA_LAYER_ARCHITECTURES = ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM", "LlamaForCausalLM")


def _refuse_architecture(fields: ConfigFields) -> None:
    archs = fields.strings("architectures")
    if archs and archs[0] not in LLAMA_LAYER_ARCHITECTURES:
        raise fields.fail(
            "architectures",
            archs,
            f"absent or one of {', '.join(LLAMA_LAYER_ARCHITECTURES)} (EAGLE3 drafts of one Llama "
            "decoder layer; other draft networks are not implemented)",
        )


def _refuse_unimplemented(fields: ConfigFields) -> None:
    """Refuse the fields of public EAGLE3 configs that change what the draft computes and that outpace does not
    implement. (Read and honoured: the layer's shapes, rope_scaling, head_dim, attention_bias, mlp_bias,
    hidden_act and tie_word_embeddings through ModelConfig's Llama reading, draft_vocab_size,
    target_hidden_size, the aux ids, use_aux_norm / fc_norm, bias (fc's, as SGLang's llama_eagle3.py),
    norm_before_residual, embed_scale and target_model_type; eagle_config's keys: ``_refuse_eagle_config``.
    Harmless: model_type, which SpecForge and SGLang never read for a LlamaForCausalLMEagle3 (SpecForge's
    phi4-mini-eagle3.json says phi3), and training or serving settings such as initializer_range, use_cache,
    attention_dropout.)"""
    eagle = fields.mapping("eagle_config")
    if eagle is not None:
        _refuse_eagle_config(eagle)
    refuse_quantized(fields, "EAGLE3")
    # vLLM llama_eagle3.py Eagle3LlamaForCausalLM: LogitsProcessor(draft_vocab_size, scale=logit_scale)
    scale = fields.number("logit_scale", 1.0)
    if scale != 1.0:
        raise fields.fail(
            "logit_scale", scale, "1.0 or absent (scaled draft logits are not implemented)"
        )


# The keys of a draft config's ``eagle_config`` that change what the draft computes, each with the value that is what
# ``Eagle3Draft`` computes and what another value would mean: another value is refused by name; null is the value.
# - use_aux_hidden_state: SGLang (model_runner.py) and vLLM (llama_eagle3.py) read it, default true; false is an
#   EAGLE-1 style draft without fc that reads the target's last hidden state as it is.
# - NVIDIA ModelOpt writes the next four into every draft it exports (modelopt/torch/export/plugins/
#   hf_spec_export.py export_spec_ckpt_config; meanings in modelopt/torch/speculative/eagle/default_config.py and
#   plugins/modeling_eagle.py EagleModule): use_input_layernorm_in_first_layer (input_layernorm over the
#   embedding), use_last_layernorm (``norm`` before the head; without it EagleModule has none), use_mtp_layernorm
#   (Megatron EAGLE's extra MTP norms), parallel_draft_step (> 1: parallel draft heads after the layer).
# - TensorRT-LLM tensorrt_llm/_torch/models/modeling_speculative.py Eagle3DraftModel reads norm_before_fc (an RMSNorm
#   over the concatenated aux states before fc), eh_proj_before_attn (an MTP-style eh_proj of [enorm(embedding),
#   hidden] before the layer) and return_hidden_post_norm (the post-norm hidden state fed back to the next step).
EAGLE_CONFIG_NEUTRAL: dict[str, tuple[bool | int, str]] = {
    "use_aux_hidden_state": (True, "an EAGLE3 draft without aux hidden states"),
    "use_input_layernorm_in_first_layer": (True, "a layer without input_layernorm"),
    "use_last_layernorm": (True, "a draft without the norm before its head"),
    "use_mtp_layernorm": (False, "ModelOpt's MTP layernorms"),
    "parallel_draft_step": (1, "parallel drafting"),
    "norm_before_fc": (False, "a norm over the aux states before fc"),
    "eh_proj_before_attn": (False, "an eh_proj before the layer"),
    "return_hidden_post_norm": (False, "feeding back the post-norm hidden state"),
}
# The other eagle_config keys outpace knows, each with a value of its type (checked, any value loads): the aux ids
# (read by ``_aux_layer_ids``), and keys that do not change what one decoder layer (the only count read) computes.
# ModelOpt's export writes next_layer_regular (TensorRT-LLM Eagle3DecoderLayer: the layers after the first take
# hidden_size inputs, not 2 * hidden_size) and parallel_draft_heads_num_layers (the depth of heads that exist only
# with parallel_draft_step > 1); TensorRT-LLM's eh_proj_bias is the bias of an eh_proj refused above.
EAGLE_CONFIG_INERT: dict[str, bool | int | None] = {
    "eagle_aux_hidden_state_layer_ids": None,
    "next_layer_regular": True,
    "parallel_draft_heads_num_layers": 1,
    "eh_proj_bias": False,
}


def _refuse_eagle_config(eagle: ConfigFields) -> None:
    """Refuse an ``eagle_config`` key whose value changes what the draft computes, and a key outpace does not know:
    ignored, it would be as silent as an unimplemented one (a misspelt aux ids key, another engine's switch)."""
    for key in eagle.data:
        if key in EAGLE_CONFIG_INERT:
            _read_like(eagle, key, EAGLE_CONFIG_INERT[key])
        elif key in EAGLE_CONFIG_NEUTRAL:
            neutral, other = EAGLE_CONFIG_NEUTRAL[key]
            value = _read_like(eagle, key, neutral)
            if value != neutral:
                raise eagle.fail(
                    key, value, f"{json.dumps(neutral)} or absent ({other} is not implemented)"
                )
        else:
            known = ", ".join([*EAGLE_CONFIG_NEUTRAL, *EAGLE_CONFIG_INERT])
            raise eagle.fail(
                key, eagle.get(key), f"absent (the eagle_config keys outpace reads: {known})"
            )


def _read_like(fields: ConfigFields, key: str, like: bool | int | None) -> bool | int | None:
    """Field ``key`` checked to have the type of ``like`` (none checked for None), ``like`` when null."""
    if isinstance(like, bool):
        return fields.boolean(key, like)
    return fields.integer(key, like) if isinstance(like, int) else fields.get(key)


def refuse_quantized(fields: ConfigFields, kind: str) -> None:
    """Refuse a quantized draft (``quantization_config``: ModelOpt exports quantized EAGLE3 heads): its weights
    load through models/loader.py ``quantize_modules`` for targets only, and a draft builds plain layers."""
    quantization = fields.get("quantization_config")
    if quantization is not None:
        raise fields.fail(
            "quantization_config",
            quantization,
            f"absent (quantized {kind} drafts are not implemented)",
        )


def refuse_quantization_file(draft_dir: Path, kind: str) -> None:
    """Refuse a draft that ModelOpt's ``hf_quant_config.json`` beside its config.json declares quantized (a
    target reads that file: model_config.py), as ``refuse_quantized`` refuses config.json's own field."""
    path = Path(draft_dir) / MODELOPT_CONFIG_FILE
    if path.is_file():
        raise ConfigError(
            f"{path}: declares the {kind} draft quantized (ModelOpt's quantization file): quantized "
            f"{kind} drafts are not implemented"
        )


def _embed_scale(cfg: dict, source: str = "config.json") -> float:
    """What the draft multiplies its embedding rows by: SpecForge pull 553 llama3_eagle.py's rule."""
    fields = ConfigFields(cfg, source)
    scale = fields.number("embed_scale", None, positive=True)
    if scale is not None:
        return float(scale)
    gemma = "gemma" in (fields.string("target_model_type", None) or "")
    return fields.integer("hidden_size") ** 0.5 if gemma else 1.0


# The speculators EAGLE3 fields that describe the layer's tensors, copied to the top level of the native form
SPECULATORS_FIELDS = (
    "draft_vocab_size",
    "target_hidden_size",
    "eagle_aux_hidden_state_layer_ids",
    "fc_norm",
    "norm_before_residual",
)


def _flatten_speculators(fields: ConfigFields) -> dict:
    """A speculators-format EAGLE3 config -> the native (flat) form ``Eagle3Config.from_dict`` reads."""
    kind = fields.get("speculators_model_type")
    if kind != "eagle3":
        raise fields.fail(
            "speculators_model_type", kind, "'eagle3' (other speculators are not implemented)"
        )
    # speculators eagle3/core.py: norm_before_fc normalises the concatenated aux states before fc (gpt-oss)
    for key in ("norm_before_fc", "norm_output"):
        if fields.boolean(key, False):
            raise fields.fail(key, True, "false or absent (not implemented)")
    if fields.get("norm_before_residual") is None:
        # speculators' Eagle3SpeculatorConfig (which always writes it) defaults it to false, vLLM's
        # transformers_utils/configs/speculators/algos.py update_eagle3 to true: absent, it means either
        raise fields.fail(
            "norm_before_residual", None, "true or false (the readers' defaults disagree)"
        )
    layer = _speculators_layer(fields)
    return {**layer, **{k: fields.get(k) for k in SPECULATORS_FIELDS if k in fields}}


def _speculators_layer(fields: ConfigFields) -> dict:
    """transformer_layer_config with transformers' LlamaConfig defaults: speculators rebuilds it as its class
    (validate_transformer_config), restoring what ``to_diff_dict()`` left out."""
    layer = fields.mapping("transformer_layer_config")
    if layer is None:
        raise fields.fail("transformer_layer_config", None, "an object (the layer's shapes)")
    model_type = layer.string("model_type", "llama")
    if (
        model_type != "llama"
    ):  # vLLM (algos.py update_eagle3) serves every eagle3 speculator as a Llama layer
        raise layer.fail(
            "model_type", model_type, "'llama' (other EAGLE3 layers are not implemented)"
        )
    for key in SIZE_FIELDS:  # (named here: LlamaConfig's own checks divide by some, naming none)
        layer.integer(key, None)
    from transformers import LlamaConfig

    # (transformers' checks raise TypeError, ValueError, ZeroDivisionError or huggingface_hub's StrictDataclassError)
    try:
        full = LlamaConfig(**layer.data).to_dict()
    except Exception as e:  # noqa: BLE001 - named below, whichever of those it is
        raise ConfigError(
            f"{fields.source}: field 'transformer_layer_config' is no valid LlamaConfig: {e}"
        ) from None
    count = full["num_hidden_layers"]
    if count != 1:
        raise layer.fail("num_hidden_layers", count, "1 (an EAGLE3 draft is one decoder layer)")
    return full


class Eagle3Layer(nn.Module):
    def __init__(self, cfg: ModelConfig, rotary, norm_before_residual: bool = False) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = DecoderAttention(cfg, rotary, input_size=2 * cfg.hidden_size)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size, cfg.hidden_act, cfg.mlp_bias)
        self.norm_before_residual = norm_before_residual

    def forward(
        self,
        positions: torch.Tensor,
        token_ids: torch.Tensor,
        embedding: nn.Embedding,
        hidden: torch.Tensor,
    ) -> torch.Tensor:
        """token_ids [n] (their rows of ``embedding``), hidden [n, hidden] -> [n, hidden] pre-norm output."""
        x = embed_norm_pair(
            token_ids,
            embedding,
            self.input_layernorm,
            hidden,
            self.hidden_norm,
            layer_fuses(self.self_attn, self.mlp, hidden),  # one launch where the layer runs fused
        )  # [n, 2 * hidden]
        return attention_and_mlp(
            self.self_attn,
            self.mlp,
            self.post_attention_layernorm,
            positions,
            x,
            self.residual(x, hidden),
        )

    def residual(self, x: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """The residual stream [n, hidden] the layer adds to: ``hidden``, or with ``norm_before_residual``
        its ``hidden_norm``, the second half of x [n, 2 * hidden] the normalised [embedding | hidden]."""
        return x[:, hidden.shape[-1] :] if self.norm_before_residual else hidden


class UnscaledRows(nn.Module):
    """[n] ids -> [n, dim]: a borrowed embedding's plain lookup (``VocabEmbedding``'s, vocab-parallel where
    the table is), without the scale a ``ScaledVocabEmbedding`` (Gemma) multiplies its rows by."""

    def __init__(self, table: VocabEmbedding) -> None:
        super().__init__()
        self.table = table

    @property
    def weight(self) -> torch.Tensor:
        return self.table.weight

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        return VocabEmbedding.forward(self.table, token_ids)


class Eagle3Draft(nn.Module):
    # speculators checkpoints may carry copies of the verifier's final norm and head
    # (Eagle3DraftModel's verifier_norm, verifier_lm_head); the target's own are used instead
    ignored_checkpoint_tensors = (r"^verifier_(norm|lm_head)\.",)

    def __init__(
        self,
        cfg: Eagle3Config,
        has_embedding: bool = False,
        has_head: bool = True,
        layer_prefix: str = "midlayer.",
        aux_norm_names: tuple[str, ...] | None = None,
    ) -> None:
        """``layer_prefix``: the checkpoint's name for the decoder layer, ``midlayer.`` or ``layers.0.``;
        ``aux_norm_names``: the checkpoint's names of the aux norms, when not ``fc_norm.{i}``."""
        super().__init__()
        lc = cfg.layer
        self.config = cfg
        self.layer_prefix = layer_prefix
        self.aux_norm_names = aux_norm_names
        self.rotary = build_rotary(lc)
        if cfg.use_aux_norm:
            self.fc_norm = nn.ModuleList(
                RMSNorm(cfg.target_hidden_size, lc.rms_norm_eps) for _ in range(cfg.num_aux)
            )
        self.fc = linear(cfg.num_aux * cfg.target_hidden_size, lc.hidden_size, bias=cfg.bias)
        self.midlayer = Eagle3Layer(lc, self.rotary, cfg.norm_before_residual)
        # NOTE: the embedding rows are read raw; their scale lives in the norm after them (module docstring)
        self.midlayer.input_layernorm.eps = lc.rms_norm_eps / cfg.embed_scale**2
        self.norm = RMSNorm(lc.hidden_size, lc.rms_norm_eps)
        if has_embedding:
            self.embed_tokens = nn.Embedding(lc.vocab_size, lc.hidden_size)
        if has_head:
            self.lm_head = linear(lc.hidden_size, cfg.draft_vocab_size)
        # draft id i -> target id i + d2t[i]; t2d marks target ids the draft vocabulary has
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.int64))
        self.register_buffer("t2d", torch.ones(lc.vocab_size, dtype=torch.bool))
        # NOTE: token maps are stored as integers (SpecForge and speculators write d2t int64, t2d bool): a
        # floating-point one is refused by the loader (weight_checks.py ``dtype_problem``), not truncated
        self.d2t.checkpoint_dtypes = INTEGER_DTYPES
        self.t2d.checkpoint_dtypes = (torch.bool, *INTEGER_DTYPES)
        # (embedding, head) borrowed from the target, kept in a tuple so they are not registered
        # as this module's submodules (their weights stay the target's, out of our state dict)
        self._borrowed: tuple[nn.Module | None, nn.Module | None] = (None, None)

    def checkpoint_name(self, param_name: str) -> str:
        if param_name.startswith("midlayer."):
            return self.layer_prefix + param_name.removeprefix("midlayer.")
        if param_name.startswith("fc_norm.") and self.aux_norm_names:
            index, rest = param_name.removeprefix("fc_norm.").split(".", 1)
            return f"{self.aux_norm_names[int(index)]}.{rest}"
        return param_name

    def attach_target(self, target: nn.Module) -> None:
        """Borrow the target's embedding (its unscaled rows: ``embed_scale`` applies) and head, each
        when the draft has none. Under tensor parallelism the draft's embedding is vocab-parallel: a target
        table kept whole on every rank (Gemma) is handed over as this rank's rows, and a head tied to it is
        rebound to those rows (layers/embedding.py ``vocab_shard_of``). A draft whose config ties its head
        (``tie_word_embeddings``: SGLang's LlamaForCausalLMEagle3 reads its embedding as its head) and that has
        neither of its own predicts through the borrowed embedding's rows, whether or not the target ties."""
        table, head = target.model.embed_tokens, target.lm_head
        rows = vocab_shard_of(table)
        tied = self.config.layer.tie_word_embeddings
        if (rows is not table or tied) and (tied or head.weight is table.weight):
            head = LMHead(rows.embedding_dim, rows.vocab_size, tied_to=rows)
        self._borrowed = (
            None if hasattr(self, "embed_tokens") else UnscaledRows(rows),
            None if hasattr(self, "lm_head") else head,
        )

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        """[n] -> [n, hidden]: the rows the layer's input norm receives (unscaled: ``embed_scale`` lives in
        that norm's eps)."""
        return self.embedding(token_ids)

    @property
    def embedding(self) -> nn.Module:
        """The draft's own embedding, or the target's rows it borrowed."""
        return self.embed_tokens if hasattr(self, "embed_tokens") else self._borrowed[0]

    @property
    def head(self) -> nn.Module:
        """The draft's own head, or the target's it borrowed."""
        return self.lm_head if hasattr(self, "lm_head") else self._borrowed[1]

    def fuse_aux(self, aux: torch.Tensor) -> torch.Tensor:
        """[n, num_aux * target_hidden] concatenated target states -> [n, hidden]."""
        if self.config.use_aux_norm:
            parts = aux.chunk(self.config.num_aux, dim=-1)
            aux = torch.cat([norm(p) for norm, p in zip(self.fc_norm, parts)], dim=-1)
        return self.fc(aux)

    def forward(
        self, token_ids: torch.Tensor, positions: torch.Tensor, hidden: torch.Tensor
    ) -> torch.Tensor:
        """token_ids [n] (token t+1), positions [n] (t), hidden [n, hidden] -> [n, hidden] pre-norm."""
        return self.midlayer(positions, token_ids, self.embedding, hidden)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[n, hidden] pre-norm -> [n, draft_vocab] float32 logits."""
        return norm_head_logits(self.norm, self.head, hidden)

    def greedy_tokens(self, hidden: torch.Tensor, target_ids: torch.Tensor) -> torch.Tensor:
        """[n, hidden] pre-norm -> [n] int64: the target id (``target_ids`` [draft_vocab]) of each row's
        argmax of ``compute_logits``, without the logits where one launch gives it (layers/fused_decoder.py)."""
        return head_argmax_tokens(self.head, hidden, self.norm, token_map=target_ids)

    def draft_to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids + self.d2t[draft_ids]


def tensor_shapes(draft_dir: Path, wanted: tuple[str, ...]) -> dict[str, tuple[int, ...]]:
    """The shapes of the tensors ``wanted`` that the checkpoint in ``draft_dir`` holds (read from the
    headers of safetensors shards; a ``.bin`` shard is loaded)."""
    shapes = {}
    for path in checkpoint_files(draft_dir):
        with open_shard(path) as f:
            for name in set(wanted) & set(f.keys()):
                part = f.get_slice(name)
                shapes[name] = tuple(part.get_shape() if hasattr(part, "get_shape") else part.shape)
    return shapes


def tensor_file(draft_dir: Path, name: str) -> Path | None:
    """The weight file of the checkpoint in ``draft_dir`` that holds tensor ``name``; None when none does."""
    for path in checkpoint_files(draft_dir):
        with open_shard(path) as f:
            if name in f.keys():
                return path
    return None


def _checkpoint_problems(
    cfg: Eagle3Config, names: set[str], shapes: dict[str, tuple[int, ...]], vocab_size: int
) -> list[str]:
    """What in the checkpoint's tensors contradicts its config.json (named by the field), or is missing."""
    problems = []
    fc = shapes.get("fc.weight")
    if fc is not None and len(fc) == 2 and fc[1] != cfg.num_aux * cfg.target_hidden_size:
        ids = list(cfg.aux_layer_ids) if cfg.aux_layer_ids else "absent (3 states)"
        problems.append(
            f"fc.weight reads {fc[1]} features, but eagle_aux_hidden_state_layer_ids {ids} x "
            f"target_hidden_size {cfg.target_hidden_size} = {cfg.num_aux * cfg.target_hidden_size}"
        )
    for name in ("lm_head.weight", "d2t"):
        shape = shapes.get(name)
        if shape is not None and shape[:1] != (cfg.draft_vocab_size,):
            problems.append(
                f"draft_vocab_size {cfg.draft_vocab_size}, but {name} has shape {shape} "
                f"({shape[0] if shape else 0} draft tokens)"
            )
    if cfg.draft_vocab_size != vocab_size and "d2t" not in names:
        problems.append(
            f"draft_vocab_size {cfg.draft_vocab_size} is not the target vocabulary {vocab_size}, and the "
            f"checkpoint has no d2t tensor mapping draft ids to target ids"
        )
    tied = cfg.layer.tie_word_embeddings
    if tied and "lm_head.weight" in names:
        problems.append(
            "tie_word_embeddings is true (the embedding is the head), but the checkpoint holds an "
            "lm_head.weight of its own: which is the head is ambiguous (set it false to use lm_head.weight)"
        )
    elif tied and "embed_tokens.weight" in names:
        problems.append(
            "tie_word_embeddings is true with an embed_tokens.weight of the draft's own: a head tied to a "
            "draft's own embedding is not implemented"
        )
    return problems


def load_eagle3_draft(
    draft_dir: str | Path, target: nn.Module, dtype: torch.dtype, device: str
) -> Eagle3Draft:
    """Load an EAGLE3 draft and check that it fits ``target``; a mismatch raises DraftMismatchError."""
    draft_dir = Path(draft_dir)
    path = draft_dir / "config.json"
    cfg = Eagle3Config.from_dict(read_json_object(path), str(path))
    refuse_quantization_file(draft_dir, "EAGLE3")
    tcfg: ModelConfig = target.config
    cfg = dataclasses.replace(
        cfg, layer=covering_positions(cfg.layer, tcfg.max_position_embeddings)
    )
    names = checkpoint_tensor_names(draft_dir)
    shapes = tensor_shapes(draft_dir, ("fc.weight", "lm_head.weight", "d2t"))
    problems = _checkpoint_problems(cfg, names, shapes, tcfg.vocab_size)
    if cfg.target_hidden_size != tcfg.hidden_size:
        problems.append(
            f"target_hidden_size {cfg.target_hidden_size} != target hidden_size {tcfg.hidden_size}"
        )
    if cfg.layer.vocab_size != tcfg.vocab_size:
        problems.append(f"vocab_size {cfg.layer.vocab_size} != target vocab_size {tcfg.vocab_size}")
    if "lm_head.weight" not in names and cfg.draft_vocab_size != tcfg.vocab_size:
        problems.append(
            f"the draft has no lm_head and its draft_vocab_size {cfg.draft_vocab_size} differs from "
            f"the target vocabulary {tcfg.vocab_size}"
        )
    if "embed_tokens.weight" not in names and cfg.layer.hidden_size != tcfg.hidden_size:
        problems.append(
            f"the draft has no embedding and its hidden_size {cfg.layer.hidden_size} differs from the "
            f"target's {tcfg.hidden_size}"
        )
    capture = target_capture_ids(cfg, target)
    bad = [i for i in capture if not 0 <= i <= tcfg.num_hidden_layers]
    if bad:
        written = (
            list(cfg.aux_layer_ids) if cfg.aux_layer_ids else "absent (the target family's default)"
        )
        problems.append(
            f"eagle_aux_hidden_state_layer_ids {written} capture the inputs of "
            f"layers {bad}, outside the target's [0, {tcfg.num_hidden_layers}]"
        )
    if problems:  # (each problem names the config.json field it contradicts)
        raise DraftMismatchError(
            f"{path}: the EAGLE3 draft does not fit the target: " + "; ".join(problems)
        )
    with default_dtype(dtype), torch.device(device):
        draft = Eagle3Draft(
            cfg,
            has_embedding="embed_tokens.weight" in names,
            has_head="lm_head.weight" in names,
            layer_prefix="layers.0."
            if any(n.startswith("layers.0.") for n in names)
            else "midlayer.",
            aux_norm_names=AUX_NORM_NAMES_SPECFORGE if "aux_norm_low.weight" in names else None,
        )
    load_checkpoint(draft, draft_dir, progress=False)
    _check_token_maps(draft, draft_dir, names, tcfg.vocab_size)
    draft.attach_target(target)
    return draft.eval()


def _check_token_maps(
    draft: Eagle3Draft, draft_dir: Path, names: set[str], vocab_size: int
) -> None:
    """Refuse a d2t that sends a draft id outside the target vocabulary or two draft ids to one target id,
    and a t2d that marks other target ids than d2t reaches, naming the file that holds the tensor. (t2d is
    read by no server; absent, it is all True and not checked.)"""
    target_ids = torch.arange(draft.d2t.numel(), device=draft.d2t.device) + draft.d2t
    problem = _d2t_problem(target_ids, vocab_size)
    if problem is not None:
        raise DraftMismatchError(f"{tensor_file(draft_dir, 'd2t')}: tensor 'd2t' {problem}")
    marked = torch.zeros_like(draft.t2d)
    marked[target_ids] = True
    if "t2d" in names and not torch.equal(marked, draft.t2d):
        raise DraftMismatchError(
            f"{tensor_file(draft_dir, 't2d')}: tensor 't2d' marks other target ids "
            f"({int(draft.t2d.sum())} of them) than the {target_ids.numel()} its d2t maps the draft "
            "vocabulary to: d2t and t2d disagree"
        )


def _d2t_problem(target_ids: torch.Tensor, vocab_size: int) -> str | None:
    """What is wrong with the target ids [draft_vocab] that d2t gives; None when they are distinct ids of the
    target vocabulary."""
    outside = ((target_ids < 0) | (target_ids >= vocab_size)).nonzero().flatten()
    if outside.numel():
        first = int(outside[0])
        return (
            f"sends {outside.numel()} draft id(s) outside the target vocabulary [0, {vocab_size}) "
            f"(draft id {first} -> {int(target_ids[first])})"
        )
    if target_ids.unique().numel() != target_ids.numel():
        return "sends two draft ids to one target id"
    return None
