"""The DeepSeek family: DeepseekV2ForCausalLM and DeepseekV3ForCausalLM (transformers' classes of those
names are the reference; DeepSeek's own configs and checkpoints load as they are), and Mistral Small 4
(Mistral4ForCausalLM: V3's layers with its own router, stacked experts and query scale; ``MISTRAL4``).

A decoder layer is multi-head latent attention (layers/mla.py: the paged cache holds one latent row per
token) and, per layer, a dense SwiGLU MLP or a mixture of experts (layers/moe.py): MoE from layer
``first_k_dense_replace`` on, every ``moe_layer_freq``-th layer (DeepSeek's DeepseekV2DecoderLayer, vLLM's
deepseek_v2.py; transformers has no moe_layer_freq and builds MoE from first_k_dense_replace on).
V2 routes with a softmax (greedy or group-limited greedy); V3 with sigmoid scores, a selection-only
correction bias and group-limited top-k (``noaux_tc``). RoPE is DeepSeek's interleaved layout (V3:
unless ``rope_interleave`` is false), optionally YaRN-scaled; YaRN also scales the softmax by
mscale(factor, mscale_all_dim)^2 (transformers yarn_apply_mscale).

MTP layers (V3 checkpoints: ``model.layers.{num_hidden_layers + k}.{enorm, hnorm, eh_proj, embed_tokens,
shared_head.norm, shared_head.head}`` beside a decoder block) are DeepSeek blocks with the MTP parts of
models/drafts/mtp.py (``OwnHeadsMTPBlock``: vLLM deepseek_mtp.py's semantics). Their block's MLP follows the
same MoE rule at its layer index num_hidden_layers + k (vLLM builds it as DeepseekV2DecoderLayer with that
prefix), so DeepSeek-V3's layer 61 is MoE. They are built only when the checkpoint has them:
transformers' save_pretrained writes num_nextn_predict_layers (DeepseekV3Config.num_mtp_layers, default 1)
without any MTP tensors.

Few rows on the GPU (decode, verify) run the stack on the fused residual path of Qwen3-Next's and Step-3.5's
layers (layers/fused_decoder.py ``run_stack``; ``DeepseekDecoderLayer.forward_fused``): MLA's down projections
read the stream through the input norm (layers/mla_fused.py), o_proj adds the residual and readies the
post-attention norm, a dense MLP folds that norm into gate/up and down_proj adds the residual, and a MoE block
runs as ``moe_block_fused``: on one GPU its routing and gate/up fold the norm in and its combine readies the next
norm, so a layer launches no norm of its own. Under tensor parallelism o_proj's and the block's partial sums are
all-reduced, added and normalised for the next block in one launch (``project_add_ready``,
``reduce_add_normalised``). Where a piece cannot (prefill, the CPU, biases, weight formats the fused kernels do not
serve: ``DeepseekDecoderLayer.fuses``) the eager residual stack runs. The MTP layers stay eager.

The model interface is the Llama family's (models/llama.py): flat tokens, metadata in the forward
context, ``forward`` -> pre-norm ``ModelOutput``, ``compute_logits``, aux hidden state capture.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import nn

from outpace.layers import fused_decoder
from outpace.layers.decoder import GatedMLP, pre_norm_residual, residual_stream
from outpace.layers.embedding import LMHead, VocabEmbedding
from outpace.layers.mla import MLAShape, MultiHeadLatentAttention
from outpace.layers.moe import MoE, stacked_experts, takes_normed_rows
from outpace.layers.norm import RMSNorm
from outpace.layers.rotary import RotaryEmbedding, yarn_mscale
from outpace.layers.router import Routing
from outpace.model_config import ModelConfig
from outpace.models.config_hooks import ConfigHooks
from outpace.models.drafts.eagle3_aux_ids import FIRST_ID_RULE
from outpace.models.drafts.mtp import OwnHeadsMTPBlock
from outpace.models.llama import LlamaForCausalLM, ModelOutput
from outpace.models.multimodal import TextOfMultimodal, llava_text_name
from outpace.validation import ConfigFields, is_finite_number, is_int, require

V2, V3 = "DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM"
# Mistral Small 4 (transformers' mistral4, mistralai/Mistral-Small-4-119B-2603): DeepSeek-V3's layers (MLA, a MoE
# block with shared experts from first_k_dense_replace on) with a softmax router limited to groups scored by their
# two best experts and no correction bias (transformers Mistral4TopkRouter), the experts stacked as transformers
# writes them (Mistral4Experts), and Ministral 3's query scale by position on MLA's whole query (Mistral4Attention)
MISTRAL4 = "Mistral4ForCausalLM"
# Kimi-K2.5 / K2.6's multimodal checkpoints (their hub name, and transformers' kimi_k25 class): a DeepSeek-V3 text
# model (text_config model_type kimi_k2 or deepseek_v3) under ``language_model.`` (``language_model.model.*``,
# ``language_model.lm_head``: the source patterns of transformers' conversion_mapping for kimi_k25) beside a
# vision tower and its projector, which are skipped (KimiK25ForCausalLM)
KIMI_K25 = ("KimiK25ForConditionalGeneration", "Kimi_K25ForConditionalGeneration")


# Mistral Small 4's published checkpoint: Mistral3ForConditionalGeneration over the mistral4 text model (registry.py
# TEXT_MODEL_VARIANTS), its tensors under ``language_model.`` beside a Pixtral tower and projector
MISTRAL3_OVER_4 = "Mistral3ForConditionalGeneration/mistral4"


def version(architecture: str) -> str:
    """The DeepSeek version whose semantics an architecture's text model has: V2, V3 or MISTRAL4."""
    if architecture == MISTRAL3_OVER_4:
        return MISTRAL4
    return V3 if architecture in KIMI_K25 else architecture


# What a config.json that omits a field means: transformers' DeepseekV2Config / DeepseekV3Config defaults
# (version-specific ones), and DeepSeek's for the fields transformers lacks (moe_layer_freq, scoring_func,
# topk_method: DeepSeek-V3's config.json has sigmoid and noaux_tc).
DEFAULTS = {
    V2: dict(
        q_lora_rank=1536,
        kv_lora_rank=512,
        qk_nope_head_dim=128,
        qk_rope_head_dim=64,
        v_head_dim=128,
        n_routed_experts=64,
        num_experts_per_tok=None,
        moe_intermediate_size=1407,
        n_shared_experts=2,
        first_k_dense_replace=0,
        n_group=None,
        topk_group=None,
        norm_topk_prob=False,
        routed_scaling_factor=1.0,
        moe_layer_freq=1,
        scoring_func="softmax",
        topk_method="greedy",
        attention_bias=False,
        mlp_bias=False,
    ),
    V3: dict(
        q_lora_rank=1536,
        kv_lora_rank=512,
        qk_nope_head_dim=128,
        qk_rope_head_dim=64,
        v_head_dim=128,
        n_routed_experts=256,
        num_experts_per_tok=8,
        moe_intermediate_size=2048,
        n_shared_experts=1,
        first_k_dense_replace=3,
        n_group=8,
        topk_group=4,
        norm_topk_prob=True,
        routed_scaling_factor=2.5,
        moe_layer_freq=1,
        scoring_func="sigmoid",
        topk_method="noaux_tc",
        attention_bias=False,
        rope_interleave=True,
    ),
    # transformers Mistral4Config's (it has no moe_layer_freq, scoring_func, topk_method or mlp_bias: its
    # transformers modules read none, and neither does outpace)
    MISTRAL4: dict(
        q_lora_rank=1024,
        kv_lora_rank=256,
        qk_nope_head_dim=64,
        qk_rope_head_dim=64,
        v_head_dim=128,
        n_routed_experts=128,
        num_experts_per_tok=4,
        moe_intermediate_size=2048,
        n_shared_experts=1,
        first_k_dense_replace=0,
        n_group=1,
        topk_group=1,
        norm_topk_prob=True,
        routed_scaling_factor=1.0,
        attention_bias=False,
        rope_interleave=True,
    ),
}


# Mistral4Config's rope_parameters when its config.json gives none (its __post_init__; the partial rotary factor it
# adds is MLA's own split, checked in ``_refuse_unimplemented_mistral4``)
MISTRAL4_ROPE = dict(
    type="yarn",
    rope_theta=10000.0,
    factor=128.0,
    original_max_position_embeddings=8192,
    beta_fast=32.0,
    beta_slow=1.0,
    mscale_all_dim=1.0,
    mscale=1.0,
    llama_4_scaling_beta=0.1,
)


@dataclass(frozen=True)
class DeepseekConfig:
    """What a DeepSeek model reads from config.json beyond ``ModelConfig`` (``from_model_config``)."""

    version: int  # 2, 3, or 4 (Mistral Small 4: ``MISTRAL4``)
    vocab_size: int
    hidden_size: int
    intermediate_size: int  # the dense layers' MLP
    num_hidden_layers: int
    rms_norm_eps: float
    hidden_act: str
    tie_word_embeddings: bool
    num_heads: int
    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    attention_bias: bool
    mlp_bias: bool  # V2: on the dense MLPs and the shared experts
    rope_interleave: bool
    max_position_embeddings: int
    rope_theta: float
    rope_scaling: dict | None
    n_routed_experts: int | None  # None: every layer dense
    moe_intermediate_size: int
    n_shared_experts: int
    first_k_dense_replace: int
    moe_layer_freq: int
    routing: Routing | None
    # the routed experts stacked (layers/moe.py ``stacked_experts``): Mistral 4's
    stacked_experts: bool
    query_scaling: tuple[float, int] | None  # Mistral 4's (ModelConfig.query_scaling)

    @classmethod
    def from_model_config(cls, cfg: ModelConfig) -> DeepseekConfig:
        arch = version(cfg.architecture)
        raw, v3, mistral4 = {**DEFAULTS[arch], **cfg.raw}, arch == V3, arch == MISTRAL4
        _refuse_unimplemented(raw, arch, cfg.num_attention_heads, cfg.num_key_value_heads)
        experts = raw["n_routed_experts"]
        return cls(
            version=4 if mistral4 else 3 if v3 else 2,
            vocab_size=cfg.vocab_size,
            hidden_size=cfg.hidden_size,
            intermediate_size=cfg.intermediate_size,
            num_hidden_layers=cfg.num_hidden_layers,
            rms_norm_eps=cfg.rms_norm_eps,
            hidden_act=cfg.hidden_act,
            tie_word_embeddings=cfg.tie_word_embeddings,
            num_heads=cfg.num_attention_heads,
            q_lora_rank=raw["q_lora_rank"],
            kv_lora_rank=raw["kv_lora_rank"],
            qk_nope_head_dim=raw["qk_nope_head_dim"],
            qk_rope_head_dim=raw["qk_rope_head_dim"],
            v_head_dim=raw["v_head_dim"],
            attention_bias=bool(raw["attention_bias"]),
            # DeepseekV3MLP and Mistral4MLP have no biases
            mlp_bias=arch == V2 and bool(raw["mlp_bias"]),
            rope_interleave=True if arch == V2 else bool(raw["rope_interleave"]),  # V2: its pairs
            max_position_embeddings=cfg.max_position_embeddings,
            rope_theta=cfg.rope_theta,
            rope_scaling=cfg.rope_scaling,
            n_routed_experts=experts,
            moe_intermediate_size=raw["moe_intermediate_size"],
            n_shared_experts=raw["n_shared_experts"] or 0,
            first_k_dense_replace=raw["first_k_dense_replace"] or 0,
            # (Mistral4DecoderLayer: MoE on every layer from first_k_dense_replace on, whatever the file says)
            moe_layer_freq=1 if mistral4 else raw["moe_layer_freq"],
            routing=None if experts is None else _routing(raw, arch),
            stacked_experts=mistral4,
            query_scaling=cfg.query_scaling,
        )

    def is_moe_layer(self, index: int) -> bool:
        """Whether decoder layer ``index`` (MTP layers: num_hidden_layers + k) is MoE (module docstring)."""
        return (
            self.n_routed_experts is not None
            and index >= self.first_k_dense_replace
            and index % self.moe_layer_freq == 0
        )

    @property
    def mla_shape(self) -> MLAShape:
        return MLAShape(
            self.hidden_size,
            self.num_heads,
            self.q_lora_rank,
            self.kv_lora_rank,
            self.qk_nope_head_dim,
            self.qk_rope_head_dim,
            self.v_head_dim,
            self.softmax_scale,
            self.attention_bias,
        )

    @property
    def softmax_scale(self) -> float:
        """qk_head_dim ** -0.5, times mscale(factor, mscale_all_dim) squared when the RoPE is scaled and
        mscale_all_dim is set (transformers yarn_apply_mscale; DeepSeek's DeepseekV3Attention)."""
        scale = (self.qk_nope_head_dim + self.qk_rope_head_dim) ** -0.5
        rope = self.rope_scaling or {}
        if rope.get("mscale_all_dim"):
            scale *= yarn_mscale(rope["factor"], rope["mscale_all_dim"]) ** 2
        return scale


def _routing(raw: dict, arch: str) -> Routing:
    """The router's settings (layers/moe.py) from a config with its defaults filled in; V3: sigmoid scores,
    noaux_tc; V2: softmax, greedy or group_limited_greedy (n_group and topk_group only for the latter);
    Mistral 4: softmax scores limited to the topk_group groups of the best two scores (Mistral4TopkRouter: one
    group without n_group), the chosen scores renormalised with norm_topk_prob."""
    v3 = arch == V3
    if arch == MISTRAL4:
        return Routing(
            num_experts=raw["n_routed_experts"],
            top_k=raw["num_experts_per_tok"],
            scoring="softmax",
            num_groups=raw["n_group"] or 1,
            top_groups=raw["topk_group"] or 1,
            group_score="top2_sum",
            normalize=bool(raw["norm_topk_prob"]),
            scaling=float(raw["routed_scaling_factor"]),
        )
    grouped = v3 or raw["topk_method"] == "group_limited_greedy"
    return Routing(
        num_experts=raw["n_routed_experts"],
        top_k=raw["num_experts_per_tok"],
        scoring="sigmoid" if v3 else "softmax",
        num_groups=raw["n_group"] if grouped else 1,
        top_groups=raw["topk_group"] if grouped else 1,
        group_score="top2_sum" if v3 else "max",
        correction_bias=v3,
        normalize=v3 and bool(raw["norm_topk_prob"]),
        scaling=float(raw["routed_scaling_factor"]),
    )


def _refuse_unimplemented(raw: dict, arch: str, heads: int, kv_heads: int) -> None:
    """ConfigError for DeepSeek config values (``raw``: defaults filled in) that change the computation and
    that outpace does not implement (or that the references disagree on)."""
    o = "ModelConfig"
    # transformers repeats each kv head num_attention_heads // num_key_value_heads times over the expanded
    # per-head keys; DeepSeek's checkpoints set the two equal.
    require(
        o,
        "num_key_value_heads",
        kv_heads,
        kv_heads == heads,
        f"num_attention_heads={heads} for MLA",
    )
    for name in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
        require(
            o, name, raw[name], isinstance(raw[name], int) and raw[name] > 0, "a positive integer"
        )
    require(
        o, "qk_rope_head_dim", raw["qk_rope_head_dim"], raw["qk_rope_head_dim"] % 2 == 0, "even"
    )
    # the types the model reads these as (a string there meant a bare ValueError at build, or bool("x"))
    for name in ("attention_bias", "mlp_bias", "rope_interleave", "norm_topk_prob"):
        value = raw.get(name, False)
        require(o, name, value, isinstance(value, bool), "true or false")
    for name in ("n_shared_experts", "first_k_dense_replace"):
        value = raw[name]
        require(o, name, value, value is None or is_int(value) and value >= 0, "an integer >= 0")
    scale = raw["routed_scaling_factor"]
    require(
        o, "routed_scaling_factor", scale, is_finite_number(scale) and scale > 0, "a number > 0"
    )
    q_rank = raw["q_lora_rank"]
    require(
        o,
        "q_lora_rank",
        q_rank,
        q_rank is None or (isinstance(q_rank, int) and q_rank > 0),
        "None or a positive integer",
    )
    if arch == MISTRAL4:
        _refuse_unimplemented_mistral4(raw)
        return
    v3 = arch == V3
    scoring = "sigmoid" if v3 else "softmax"
    require(
        o,
        "scoring_func",
        raw["scoring_func"],
        raw["scoring_func"] == scoring,
        f"{scoring!r} for this version",
    )
    methods = ("noaux_tc",) if v3 else ("greedy", "group_limited_greedy")
    require(
        o,
        "topk_method",
        raw["topk_method"],
        raw["topk_method"] in methods,
        f"one of {', '.join(methods)}",
    )
    if (
        not v3
    ):  # transformers' V2 router ignores norm_topk_prob, DeepSeek's normalises and then does not
        # scale, vLLM normalises and scales: no reference to be exact against.
        require(
            o,
            "norm_topk_prob",
            raw["norm_topk_prob"],
            not raw["norm_topk_prob"],
            "false for V2 (its references disagree on what true computes)",
        )
    freq = raw["moe_layer_freq"]
    require(o, "moe_layer_freq", freq, isinstance(freq, int) and freq > 0, "a positive integer")
    if raw["n_routed_experts"] is not None:
        _check_routing(raw, v3)


def _refuse_unimplemented_mistral4(raw: dict) -> None:
    """Mistral 4's checks: its routing's counts and groups (as V3's, the groups scored by their two best), and
    the partial rotary factor its config derives, qk_rope_head_dim / (qk_nope_head_dim + qk_rope_head_dim)
    (Mistral4Config.__post_init__: MLA rotates the qk_rope_head_dim dimensions alone, whatever the factor)."""
    if raw["n_routed_experts"] is not None:
        _check_routing(
            {**raw, "n_group": raw["n_group"] or 1, "topk_group": raw["topk_group"] or 1}, True
        )
    rope, nope = raw["qk_rope_head_dim"], raw["qk_nope_head_dim"]
    params = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    factor = params.get("partial_rotary_factor", rope / (nope + rope))
    require(
        "ModelConfig",
        "rope_parameters.partial_rotary_factor",
        factor,
        factor == rope / (nope + rope),
        f"qk_rope_head_dim / (qk_nope_head_dim + qk_rope_head_dim) = {rope / (nope + rope)}",
    )


def _check_routing(raw: dict, v3: bool) -> None:
    o = "ModelConfig"
    experts, top_k = raw["n_routed_experts"], raw["num_experts_per_tok"]
    require(
        o,
        "n_routed_experts",
        experts,
        isinstance(experts, int) and experts > 0,
        "a positive integer or None",
    )
    require(
        o,
        "num_experts_per_tok",
        top_k,
        isinstance(top_k, int) and 0 < top_k <= experts,
        f"an integer in [1, n_routed_experts={experts}]",
    )
    if v3 or raw["topk_method"] == "group_limited_greedy":
        groups, top_groups = raw["n_group"], raw["topk_group"]
        require(
            o,
            "n_group",
            groups,
            isinstance(groups, int)
            and groups > 0
            and experts % groups == 0
            and (not v3 or experts // groups >= 2),
            f"a divisor of n_routed_experts={experts}"
            + (" leaving >= 2 experts per group (a group is scored by its two best)" if v3 else ""),
        )
        require(
            o,
            "topk_group",
            top_groups,
            isinstance(top_groups, int)
            and 0 < top_groups <= groups
            and top_k <= top_groups * (experts // groups),
            f"an integer in [1, n_group={groups}] whose groups hold num_experts_per_tok={top_k} experts",
        )


class DeepseekDecoderLayer(nn.Module):
    def __init__(self, cfg: DeepseekConfig, rotary: RotaryEmbedding, index: int) -> None:
        """``index``: the layer's index in the checkpoint (MTP layers after the decoder stack), which
        decides dense or MoE."""
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = MultiHeadLatentAttention(cfg.mla_shape, rotary)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

        def mlp(size: int, bias: bool, **shard) -> GatedMLP:
            return GatedMLP(cfg.hidden_size, size, cfg.hidden_act, bias, **shard)

        self.is_moe = cfg.is_moe_layer(index)
        if self.is_moe:
            self.mlp = MoE(
                cfg.hidden_size,
                cfg.routing,
                cfg.moe_intermediate_size,
                cfg.n_shared_experts,
                mlp,
                shared_bias=cfg.mlp_bias,
                experts=stacked_experts(
                    cfg.hidden_act,
                    cfg.routing.num_experts,
                    cfg.hidden_size,
                    cfg.moe_intermediate_size,
                )
                if cfg.stacked_experts
                else None,
            )
        else:
            self.mlp = mlp(cfg.intermediate_size, cfg.mlp_bias)

    def forward(self, positions: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """h [num_tokens, hidden] -> the layer's output [num_tokens, hidden] (h + attention + MLP)."""
        return residual_stream(*self.forward_residual(positions, h, None))

    def forward_residual(
        self, positions: torch.Tensor, h: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """As DecoderLayer.forward_residual (layers/decoder.py): the input and the output stream split as
        (h, residual), each residual add fused into the RMSNorm after it."""
        return pre_norm_residual(self, positions, h, residual)

    def fuses(self, h: torch.Tensor) -> bool:
        """Whether ``forward_fused`` serves the stream h [num_tokens, hidden]: MLA's fused block (layers/mla.py
        ``fuses``: no biases, an o_proj that ends a block), an o_proj whose weight the fused kernels serve on
        these rows (layers/fused_decoder.py ``fused_weight``, ``fusable_output``: a block-FP8 one through its
        quantized product, the residual add and the next norm in the product's store), and a dense MLP that
        ``mlp_fuses`` (a MoE block: ``moe_block_fused``)."""
        attn = self.self_attn
        o_weight = fused_decoder.fused_weight(attn.o_proj)
        return (
            attn.fuses(h)
            and o_weight is not None
            and fused_decoder.fusable_output(h, o_weight)
            and (self.is_moe or fused_decoder.mlp_fuses(self.mlp))
        )

    def forward_fused(self, positions: torch.Tensor, rows, next_norm: nn.Module):
        """rows: the layer's input stream made ready for its input norm (``NormedRows``, or after a row-parallel
        block ``NormalisedRows``) -> its output stream made ready for ``next_norm``, as Qwen3-Next's and
        Step-3.5's layers: MLA's down projections fold the input norm in (layers/mla.py ``attend_rows``), o_proj
        adds the residual and readies the post-attention norm; a dense MLP folds that norm into gate/up and
        down_proj adds the residual; a MoE block as layers/fused_decoder.py ``moe_block_fused`` runs it (on one
        GPU the norm folded into routing and gate/up, the next norm readied by the experts' combine)."""
        attn, post = self.self_attn, self.post_attention_layernorm
        out = attn.attend_rows(
            positions, fused_decoder.kernel_rows(rows), self.input_layernorm.eps
        )  # [num_tokens, heads * v_head_dim]
        if not self.is_moe:
            mid = fused_decoder.project_add_ready(out, attn.o_proj, rows.stream, post)
            return fused_decoder.mlp_fused(self.mlp, mid, post.eps, next_norm)
        moe = self.mlp
        return fused_decoder.moe_block_fused(
            out,
            attn.o_proj,
            rows.stream,
            post,
            next_norm,
            moe.partial,
            takes_normed_rows(moe.gate, moe.experts, moe.shared_experts, rows.stream),
            moe.group,
        )


class DeepseekMTPLayer(OwnHeadsMTPBlock, DeepseekDecoderLayer):
    """An MTP layer of a DeepSeek-V3 checkpoint: its own embedding and shared head around a DeepSeek block."""


class DeepseekModel(nn.Module):
    def __init__(self, cfg: DeepseekConfig) -> None:
        super().__init__()
        self.rotary = RotaryEmbedding(
            cfg.qk_rope_head_dim,
            cfg.max_position_embeddings,
            cfg.rope_theta,
            cfg.rope_scaling,
            interleaved=cfg.rope_interleave,
            query_scaling=cfg.query_scaling,
        )
        self.embed_tokens = VocabEmbedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(
            DeepseekDecoderLayer(cfg, self.rotary, i) for i in range(cfg.num_hidden_layers)
        )
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class DeepseekForCausalLM(nn.Module, ConfigHooks):
    ignored_checkpoint_tensors = (r"\.rotary_emb\.inv_freq$",)
    # Sharded over tensor-parallel ranks when built inside distributed.group.building_in: MLA's heads
    # (layers/mla.py), every expert's rows (layers/moe.py), the dense MLPs, vocab-parallel embedding and heads.
    shards_over_ranks = True
    # The layout of its published MTP layers: their own embedding and shared head (what a dummy load, with no
    # tensor names to tell, builds for a config that counts MTP layers: models/loader.py)
    mtp_own_heads = True

    @classmethod
    def config_defaults(cls, cfg: ConfigFields) -> dict:
        archs = cfg.get("architectures")
        arch = archs[0] if isinstance(archs, list) and archs else None
        # DeepseekV2Config's max_position_embeddings (DeepseekV3Config's is the common 4096, Mistral4Config's
        # Mistral4ForCausalLM.config_overrides'): the length YaRN scales from where its parameters give none
        if arch == V2 and "max_position_embeddings" not in cfg:
            return {"max_position_embeddings": 2048}
        # DeepseekV3Config's num_nextn_predict_layers, 1: MTP layers are built only where the checkpoint has them
        # (``mtp_own_heads``); read as 0, a checkpoint's MTP layer (layer num_hidden_layers) was refused
        if arch is not None and version(arch) == V3 and "num_nextn_predict_layers" not in cfg:
            return {"num_nextn_predict_layers": 1}
        return {}

    @classmethod
    def config_overrides(cls, cfg: ConfigFields) -> dict:
        # DeepseekV2Config / DeepseekV3Config.__post_init__ derive head_dim from qk_rope_head_dim (the
        # file's head_dim is not read; MLA's shapes are DeepseekConfig's)
        return {"head_dim": cfg.integer("qk_rope_head_dim", DEFAULTS[V3]["qk_rope_head_dim"])}

    def __init__(self, cfg: ModelConfig, mtp_own_heads: bool = False) -> None:
        """``mtp_own_heads``: the checkpoint has MTP layers in DeepSeek's layout (the loader decides from its
        tensor names, models/drafts/mtp.py has_own_mtp_heads); without them the model has none and its config
        says num_nextn_predict_layers 0."""
        super().__init__()
        ds = self.deepseek_config = DeepseekConfig.from_model_config(cfg)
        self.config = cfg if mtp_own_heads else dataclasses.replace(cfg, num_nextn_predict_layers=0)
        self.model = DeepseekModel(ds)
        self.lm_head = LMHead(
            ds.hidden_size,
            ds.vocab_size,
            tied_to=self.model.embed_tokens if ds.tie_word_embeddings else None,
        )
        self.aux_layer_ids: tuple[int, ...] = ()
        if self.config.num_nextn_predict_layers:
            n = ds.num_hidden_layers
            self.mtp_layers = nn.ModuleList(
                DeepseekMTPLayer(ds, self.model.rotary, n + k)
                for k in range(self.config.num_nextn_predict_layers)
            )

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> ModelOutput:
        """input_ids, positions [num_tokens] -> the last layer's output, pre-norm, and the aux states. Few rows
        on the GPU: the fused residual stack (layers/fused_decoder.py ``run_stack``) where every layer takes
        it (``DeepseekDecoderLayer.fuses``), else the eager one, each residual add fused into the norm after
        it."""
        layers = self.model.layers
        norms = [layer.input_layernorm for layer in layers]
        h, captured = fused_decoder.run_stack(
            layers, norms, self.model.norm, positions, self.embed(input_ids), self.aux_layer_ids
        )
        return self._model_output(h, captured)

    # The rest of the decoder-stack plumbing is the Llama family's, unchanged (models/llama.py): aux layer
    # capture, embedding, final norm and head, MTP checkpoint names after the decoder layers.
    set_aux_hidden_state_layers = LlamaForCausalLM.set_aux_hidden_state_layers
    # EAGLE3 drafts for DeepSeek/Kimi targets write ids in either convention, told apart by the first id
    eagle3_aux_ids = FIRST_ID_RULE
    embed = LlamaForCausalLM.embed
    _model_output = LlamaForCausalLM._model_output
    compute_logits = LlamaForCausalLM.compute_logits
    greedy_tokens = LlamaForCausalLM.greedy_tokens
    checkpoint_name = LlamaForCausalLM.checkpoint_name


class KimiK25ForCausalLM(TextOfMultimodal, DeepseekForCausalLM):
    """A Kimi-K2.5 / K2.6 checkpoint's DeepSeek-V3 text model (``KIMI_K25``): its tensors under
    ``language_model.``, the vision tower and the projector skipped."""

    TOWERS = ("vision_tower", "mm_projector")
    text_name = staticmethod(llava_text_name)


class Mistral4ForCausalLM(DeepseekForCausalLM):
    """Mistral Small 4's text model (``MISTRAL4``): DeepSeek-V3's stack with Mistral 4's router, stacked experts
    (``mlp.experts.gate_up_proj`` [experts, 2 * inter, hidden], ``mlp.experts.down_proj`` [experts, hidden,
    inter]) and the query scale by position (rope_parameters' ``llama_4_scaling_beta``, layers/mla.py)."""

    query_scaling = True
    partial_rotary = (
        True  # the factor Mistral4Config derives, checked in DeepseekConfig (MLA's own rope split)
    )

    @classmethod
    def config_overrides(cls, cfg: ConfigFields) -> dict:
        values = {
            **super().config_overrides(cfg),
            "max_position_embeddings": cfg.integer("max_position_embeddings", 1048576),
        }
        if cfg.get("rope_parameters") is None and cfg.get("rope_scaling") is None:
            # Mistral4Config.__post_init__'s rope_parameters where the file has none
            values |= {
                "rope_theta": MISTRAL4_ROPE["rope_theta"],
                "rope_scaling": dict(MISTRAL4_ROPE),
                "query_scaling": (
                    MISTRAL4_ROPE["llama_4_scaling_beta"],
                    MISTRAL4_ROPE["original_max_position_embeddings"],
                ),
            }
        return values


class Mistral4TextForCausalLM(TextOfMultimodal, Mistral4ForCausalLM):
    """Mistral Small 4 as published (``MISTRAL3_OVER_4``): the text model's tensors under ``language_model.``, the
    Pixtral vision tower and the projector skipped (as models/mistral.py's Mistral3TextForCausalLM)."""

    TOWERS = ("vision_tower", "multi_modal_projector")
    text_name = staticmethod(llava_text_name)
