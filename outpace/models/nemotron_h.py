"""Nemotron-H: NemotronHForCausalLM (transformers' class of that name is the reference). A stack of
blocks, each ``x + mixer(RMSNorm(x))`` with one mixer per block as the config's ``layers_block_type``
(or the older ``hybrid_override_pattern``: M mamba, * attention, - MLP, E experts) says:
- "linear_attention": Mamba2 (layers/mamba2.py; a recurrent state per request: layers/recurrent.py);
- "full_attention": attention without positional encoding (no RoPE) and without biases;
- "mlp": up_proj, the activation (relu2 in the released models), down_proj, no gate;
- "moe": routed experts shaped like that MLP, chosen by sigmoid scores plus a selection-only correction
  bias within the best groups (DeepSeek-V3's routing, layers/moe.py), plus one shared expert of
  ``moe_shared_expert_intermediate_size``. With ``moe_latent_size`` (the latent MoE: transformers NemotronHMoE's
  fc1_latent_proj / fc2_latent_proj) the routed experts work in a latent space: the router reads x, the experts
  fc1_latent_proj(x) [n, latent], and fc2_latent_proj brings their sum back; the shared expert reads x.
RMSNorms apply their weight in float32 (transformers NemotronHRMSNorm).

Few rows on the GPU (decode, verify) run the stack in the fused residual style of the Llama layers
(layers/fused_decoder.py ``run_fused_layers``): each block's input projection (Mamba2's in_proj, the
attention's packed q/k/v, the MLP's up_proj) reads the stream through the norm-folding kernel and its last
projection (out_proj, o_proj, down_proj) adds the residual and makes the stream ready for the next block's
norm, so no RMSNorm runs as a launch of its own. A MoE block reads its input whole: it is normalised in one
launch and its output added and normalised for the next block in another (``NormalisedRows``), as the
eager path does.

Checkpoint names live under ``backbone.`` (``embeddings``, ``layers.{i}.{norm,mixer}``, ``norm_f``); the
model interface is the Llama family's (models/llama.py). A config that counts an MTP step
(``num_nextn_predict_layers``: Nemotron 3 Super) builds its ``mtp.*`` stack of attention and MoE blocks, which
``--method mtp`` drafts with (models/drafts/nemotron_h_mtp.py).

Tensor parallelism (outpace/distributed/), as vLLM and SGLang shard it: Mamba2's heads and groups
(layers/mamba2.py), attention heads (layers/decoder.py HeadProjections), the MLPs' and every expert's
intermediate rows (the shared expert's too; one all-reduce per mixture), the embedding and head
vocab-parallel.
"""

from __future__ import annotations

import re

import torch
from torch import nn

from outpace.attention.layer import Attention
from outpace.distributed.collectives import all_reduce
from outpace.distributed.group import build_group
from outpace.layers import fused_decoder
from outpace.layers.activation import ACTIVATIONS
from outpace.layers.decoder import (
    HeadProjections,
    PackedProjection,
    residual_stream,
)
from outpace.layers.embedding import LMHead, VocabEmbedding
from outpace.layers.fused_decoder import (
    add_normalised,
    block_fuses,
    fused_weight,
    norm_head_logits,
    normalised_input,
    project_add_ready,
    project_normalised,
    run_stack,
)
from outpace.layers.linear import column_parallel, linear, row_parallel
from outpace.layers.mamba2 import Mamba2Mixer
from outpace.layers.moe import (
    ExpertActivation,
    FusedShared,
    RoutedExperts,
    expert_modules,
    experts_on_kernels,
    moe_on_kernels,
)
from outpace.layers.norm import Float32RMSNorm
from outpace.layers.router import Router, Routing
from outpace.model_config import ModelConfig
from outpace.models.config_hooks import ConfigHooks
from outpace.models.drafts.nemotron_h_mtp import NemotronHMTP
from outpace.models.llama import LlamaForCausalLM, ModelOutput
from outpace.validation import ConfigError, ConfigFields, is_int, require

PATTERN = {"M": "linear_attention", "*": "full_attention", "-": "mlp", "E": "moe"}
# the older names a config's block type lists may hold (transformers configuration_utils' _LEGACY_LAYER_TYPE_REMAP)
LEGACY_TYPES = {"mamba": "linear_attention", "attention": "full_attention"}

# transformers' NemotronHConfig defaults for fields a config.json may omit
DEFAULTS = dict(
    layer_norm_epsilon=1e-5,
    mlp_hidden_act="relu2",
    mlp_bias=False,
    mamba_num_heads=128,
    mamba_head_dim=64,
    ssm_state_size=128,
    n_groups=8,
    conv_kernel=4,
    use_conv_bias=True,
    use_bias=False,
    mamba_hidden_act="silu",
    time_step_min=0.001,
    n_routed_experts=8,
    num_experts_per_tok=2,
    moe_intermediate_size=7688,
    moe_shared_expert_intermediate_size=7688,
    n_group=1,
    topk_group=1,
    norm_topk_prob=True,
    routed_scaling_factor=1.0,
    moe_latent_size=None,
    mamba_ssm_cache_dtype="float32",
)
# the switches the blocks read with bool(): a JSON bool or null (false, as transformers' truth tests read it); a
# string there ("false") was taken as true
SWITCHES = ("mlp_bias", "use_conv_bias", "use_bias", "norm_topk_prob")


def block_types(raw: dict) -> tuple[str, ...]:
    """Each block's mixer (module docstring)."""
    if raw.get("layers_block_type"):
        return tuple(LEGACY_TYPES.get(t, t) for t in raw["layers_block_type"])
    pattern = raw.get("hybrid_override_pattern") or ""
    require(
        "ModelConfig",
        "hybrid_override_pattern",
        pattern,
        bool(pattern) and set(pattern) <= set(PATTERN),
        f"a non-empty string of {''.join(PATTERN)}",
    )
    return tuple(PATTERN[c] for c in pattern)


def mtp_block_types(raw: dict) -> tuple[str, ...]:
    """The MTP stack's block mixers (models/drafts/nemotron_h_mtp.py): ``mtp_layers_block_type``, else the older
    ``mtp_hybrid_override_pattern``, else transformers' default (attention, then experts)."""
    if raw.get("mtp_layers_block_type"):
        types = tuple(LEGACY_TYPES.get(t, t) for t in raw["mtp_layers_block_type"])
    else:
        types = tuple(PATTERN.get(c, c) for c in raw.get("mtp_hybrid_override_pattern") or "*E")
    require(
        "ModelConfig",
        "mtp_layers_block_type",
        types,
        bool(types) and set(types) <= {"full_attention", "moe"},
        "entries of full_attention, moe (the blocks vLLM's nemotron_h_mtp builds)",
    )
    return types


def _refuse_unimplemented(raw: dict, types: tuple[str, ...]) -> None:
    o = "ModelConfig"
    require(
        o,
        "layers_block_type",
        types,
        set(types) <= set(PATTERN.values()),
        f"entries of {', '.join(PATTERN.values())}",
    )
    latent = raw["moe_latent_size"]
    require(
        o,
        "moe_latent_size",
        latent,
        latent is None or (is_int(latent) and latent > 0),
        "None or > 0",
    )
    require(
        o,
        "mamba_ssm_cache_dtype",
        raw["mamba_ssm_cache_dtype"],
        raw["mamba_ssm_cache_dtype"] == "float32",
        "float32 (the state outpace keeps)",
    )
    for name in ("mlp_hidden_act", "mamba_hidden_act"):
        require(o, name, raw[name], raw[name] in ACTIVATIONS, f"one of {', '.join(ACTIVATIONS)}")
    require(
        o,
        "mamba_num_heads",
        raw["mamba_num_heads"],
        raw["mamba_num_heads"] % raw["n_groups"] == 0,
        f"a multiple of n_groups={raw['n_groups']}",
    )


class UngatedMLP(nn.Module):
    """down_proj(act(up_proj(x))): [n, hidden] -> [n, hidden]."""

    def __init__(
        self,
        hidden_size: int,
        intermediate_size: int,
        act: str,
        bias: bool,
        reduce: bool = True,
        what: str = "intermediate_size",
    ) -> None:
        """Sharded as layers/decoder.py's GatedMLP: ``reduce=False`` leaves the partial sum to the caller."""
        super().__init__()
        self.act = act
        self.up_proj = column_parallel(hidden_size, intermediate_size, bias, what=what)
        self.down_proj = row_parallel(intermediate_size, hidden_size, bias, what, reduce)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(ACTIVATIONS[self.act](self.up_proj(x)))


class NemotronHMoE(nn.Module):
    """Routed ungated experts plus a shared one (module docstring): [n, hidden] -> [n, hidden]. Checkpoint
    names: ``gate.weight``, ``gate.e_score_correction_bias``, ``experts.{e}.{up,down}_proj``,
    ``shared_experts.{up,down}_proj``; with a latent size ``fc1_latent_proj`` and ``fc2_latent_proj`` (whole on
    every rank: the experts' partial sums are all-reduced in the latent space before fc2)."""

    def __init__(self, hidden_size: int, raw: dict) -> None:
        super().__init__()
        experts, top_k = raw["n_routed_experts"], raw["num_experts_per_tok"]
        require(
            "ModelConfig",
            "num_experts_per_tok",
            top_k,
            0 < top_k <= experts,
            f"in [1, n_routed_experts={experts}]",
        )
        # transformers NemotronHTopkRouter: groups scored by the sum of their two best (corrected) scores
        self.gate = Router(
            hidden_size,
            Routing(
                experts,
                top_k,
                "sigmoid",
                raw["n_group"],
                raw["topk_group"],
                "top2_sum",
                correction_bias=True,
                normalize=bool(raw["norm_topk_prob"]),
                scaling=raw["routed_scaling_factor"],
            ),
        )
        act, bias, self.group = raw["mlp_hidden_act"], raw["mlp_bias"], build_group()
        self.latent = raw["moe_latent_size"]
        if self.latent is not None:
            self.fc1_latent_proj = linear(hidden_size, self.latent, bool(bias))
            self.fc2_latent_proj = linear(self.latent, hidden_size, bool(bias))
        self.experts = RoutedExperts(
            ExpertActivation(act, gated=False),
            expert_modules(  # (this rank's experts, whole, under expert parallelism)
                experts,
                lambda: UngatedMLP(
                    self.latent or hidden_size,
                    raw["moe_intermediate_size"],
                    act,
                    False,
                    reduce=False,
                    what="moe_intermediate_size",
                ),
            ),
            num_experts=experts,
        )
        self.shared_experts = UngatedMLP(
            hidden_size,
            raw["moe_shared_expert_intermediate_size"],
            act,
            bias,
            reduce=False,
            what="moe_shared_expert_intermediate_size",
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # every expert's rows split over the ranks (layers/moe.py MoE): one all-reduce of the partial sums
        if self.latent is not None:
            return self._latent(x)
        if self.experts.uses_kernels(x):  # routing with the block layout, the shared expert fused
            return all_reduce(
                moe_on_kernels(x, self.gate, self.experts, self.shared_experts), self.group
            )
        weights, ids = self.gate(x)
        return all_reduce(self.experts(x, weights, ids) + self.shared_experts(x), self.group)

    def _latent(self, x: torch.Tensor) -> torch.Tensor:
        """The latent MoE (module docstring): the routed experts over fc1_latent_proj(x), their sum all-reduced
        and brought back by fc2_latent_proj, the shared expert over x beside them."""
        z = self.fc1_latent_proj(x)  # [n, latent]
        if self.experts.uses_kernels(x):  # (the router reads x: the kernels' router input)
            routed = experts_on_kernels(z, self.gate, self.experts, FusedShared(), router_input=x)
        else:
            routed = self.experts(z, *self.gate(x))
        routed = self.fc2_latent_proj(all_reduce(routed, self.group))
        return routed + all_reduce(self.shared_experts(x), self.group)


class PlainAttention(nn.Module):
    """Attention without positional encoding or biases: [n, hidden] -> [n, hidden]."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.head_dim = cfg.head_dim
        p = HeadProjections(
            cfg.hidden_size,
            cfg.hidden_size,
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim,
            False,
            False,
        )  # heads split over tensor-parallel ranks
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = p.q_proj, p.k_proj, p.v_proj, p.o_proj
        self.attn = Attention(p.heads, p.kv_heads, cfg.head_dim)
        # q/k/v packed by layers/decoder.py ``pack_projections`` for the fused path (module docstring)
        self.qkv: PackedProjection | None = None

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return self.o_proj(self.attend(positions, self.q_proj(x), self.k_proj(x), self.v_proj(x)))

    def attend_fused(self, positions: torch.Tensor, rows, eps: float) -> torch.Tensor:
        """The fused path's attention (``NemotronHBlock.fuses``): rows, the stream made ready for the
        block's norm of eps ``eps``, -> the attention output [n, heads * head_dim] before o_proj, q/k/v
        as one norm-folding kernel."""
        q, k, v = project_normalised(rows, eps, self.qkv.weight).split(self.qkv.sizes, dim=-1)
        return self.attend(positions, q, k, v)

    def attend(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        """q [n, q_size], k, v [n, kv_size] -> the attention output [n, heads * head_dim]."""
        n, d = q.shape[0], self.head_dim
        return self.attn(q.view(n, -1, d), k.view(n, -1, d), v.view(n, -1, d), positions)


def mamba_step_fused(mixer: Mamba2Mixer, rows, eps: float) -> torch.Tensor:
    """The fused path's Mamba2 step (``NemotronHBlock.fuses``): rows, the stream made ready for the block's
    norm of eps ``eps``, -> y [n, inner] before out_proj: ``Mamba2Mixer.step_kernel`` with in_proj as the
    norm-folding kernel."""
    return mixer.step_kernel(project_normalised(rows, eps, fused_weight(mixer.in_proj)))


class NemotronHBlock(nn.Module):
    def __init__(self, cfg: ModelConfig, raw: dict, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.norm = Float32RMSNorm(cfg.hidden_size, raw["layer_norm_epsilon"])
        if kind == "linear_attention":
            self.mixer = Mamba2Mixer(
                cfg.hidden_size,
                raw["mamba_num_heads"],
                raw["mamba_head_dim"],
                raw["n_groups"],
                raw["ssm_state_size"],
                raw["conv_kernel"],
                bool(raw["use_conv_bias"]),
                bool(raw["use_bias"]),
                raw["mamba_hidden_act"],
                raw["time_step_min"],
                raw["layer_norm_epsilon"],
            )
        elif kind == "full_attention":
            self.mixer = PlainAttention(cfg)
        elif kind == "mlp":
            self.mixer = UngatedMLP(
                cfg.hidden_size, cfg.intermediate_size, raw["mlp_hidden_act"], bool(raw["mlp_bias"])
            )
        else:
            self.mixer = NemotronHMoE(cfg.hidden_size, raw)

    def forward(self, positions: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """h [num_tokens, hidden] -> h + mixer(norm(h))."""
        return residual_stream(*self.forward_residual(positions, h, None))

    def forward_residual(
        self, positions: torch.Tensor, h: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The stream h + residual in, (mixer output, stream) out: the residual add fused into the norm."""
        x, residual = (self.norm(h), h) if residual is None else self.norm(h, residual)
        return (
            self.mixer(positions, x) if self.kind == "full_attention" else self.mixer(x)
        ), residual

    def fuses(self, h: torch.Tensor) -> bool:
        """Whether ``forward_fused`` serves the stream h [num_tokens, hidden] (``block_fuses``; Mamba2: the
        step kernel taking this forward; a MoE reads its input materialised, ``forward_fused``: few rows on
        the GPU for the stream's kernels)."""
        mixer = self.mixer
        if self.kind == "linear_attention":
            return block_fuses(h, mixer.in_proj, mixer.out_proj) and mixer.takes_fused_step(h)
        if self.kind == "full_attention":
            return block_fuses(h, mixer.qkv, mixer.o_proj)
        if self.kind == "moe":
            return fused_decoder.fusable_rows(h, self.norm.weight)
        return block_fuses(h, mixer.up_proj, mixer.down_proj)

    def forward_fused(self, positions: torch.Tensor, rows, next_norm: nn.Module):
        """rows: the block's input stream made ready for its norm (``NormedRows`` or ``NormalisedRows``) ->
        its output stream made ready for ``next_norm`` (module docstring)."""
        mixer, eps = self.mixer, self.norm.eps
        if self.kind == "moe":
            return add_normalised(mixer(normalised_input(rows, self.norm)), rows.stream, next_norm)
        if self.kind == "linear_attention":
            out, out_proj = mamba_step_fused(mixer, rows, eps), mixer.out_proj
        elif self.kind == "full_attention":
            out, out_proj = mixer.attend_fused(positions, rows, eps), mixer.o_proj
        else:  # relu2 (the released models') runs in up_proj's kernel
            relu2 = mixer.act == "relu2"
            up = project_normalised(rows, eps, fused_weight(mixer.up_proj), relu2=relu2)
            out, out_proj = up if relu2 else ACTIVATIONS[mixer.act](up), mixer.down_proj
        return project_add_ready(out, out_proj, rows.stream, next_norm)


class NemotronHModel(nn.Module):
    def __init__(self, cfg: ModelConfig, raw: dict, types: tuple[str, ...]) -> None:
        super().__init__()
        self.embed_tokens = VocabEmbedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(NemotronHBlock(cfg, raw, kind) for kind in types)
        self.norm = Float32RMSNorm(cfg.hidden_size, raw["layer_norm_epsilon"])


class NemotronHForCausalLM(nn.Module, ConfigHooks):
    # Sharded over tensor-parallel ranks when built inside distributed.group.building_in (module docstring).
    shards_over_ranks = True
    class_defaults = {"head_dim": 128, "num_key_value_heads": 8}  # NemotronHConfig's

    @classmethod
    def config_overrides(cls, cfg: ConfigFields) -> dict:
        # transformers' NemotronHConfig derives the layer count from its pattern and does not save it
        pattern = cfg.strings("layers_block_type") or cfg.string("hybrid_override_pattern", "")
        for name in SWITCHES:
            cfg.boolean(name, False)  # refused by name unless true, false or null
        return {"num_hidden_layers": cfg.integer("num_hidden_layers", len(pattern))}

    def __init__(self, cfg: ModelConfig, mtp_own_heads: bool = False) -> None:
        super().__init__()
        if mtp_own_heads:
            raise ConfigError(
                f"{cfg.architecture}: num_nextn_predict_layers = {cfg.num_nextn_predict_layers} with MTP "
                f"layers in DeepSeek-V3's layout; Nemotron-H's are mtp.* (models/drafts/nemotron_h_mtp.py)"
            )
        raw = {**DEFAULTS, **cfg.raw}
        types = block_types(raw)
        require(
            "ModelConfig",
            "num_hidden_layers",
            cfg.num_hidden_layers,
            cfg.num_hidden_layers == len(types),
            f"the number of block types ({len(types)})",
        )
        _refuse_unimplemented(raw, types)
        num_mtp = cfg.num_nextn_predict_layers
        require(
            "ModelConfig",
            "num_nextn_predict_layers",
            num_mtp,
            num_mtp in (0, 1),
            "0 or 1 (one MTP step, as vLLM's nemotron_h_mtp serves it)",
        )
        self.config = cfg
        self.model = NemotronHModel(cfg, raw, types)
        self.lm_head = LMHead(
            cfg.hidden_size,
            cfg.vocab_size,
            tied_to=self.model.embed_tokens if cfg.tie_word_embeddings else None,
        )
        self.aux_layer_ids: tuple[int, ...] = ()
        self.ignored_checkpoint_tensors = () if num_mtp else (r"^mtp\.",)
        # the MTP stack, registered before its step so that its parameters are named mtp.* as in the checkpoint
        if num_mtp:
            blocks = [NemotronHBlock(cfg, raw, kind) for kind in mtp_block_types(raw)]
            self.mtp = NemotronHMTP(cfg.hidden_size, raw["layer_norm_epsilon"], blocks)
            self.mtp_layers = self.mtp.steps()

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> ModelOutput:
        """input_ids, positions [num_tokens] -> the last block's output, pre-norm, and the aux states. Few
        rows on the GPU: the fused path (module docstring) where every block takes it."""
        blocks, h = self.model.layers, self.embed(input_ids)
        norms = [block.norm for block in blocks]
        h, captured = run_stack(blocks, norms, self.model.norm, positions, h, self.aux_layer_ids)
        return self._model_output(h, captured)

    def compute_logits(
        self, hidden_states: torch.Tensor, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """[n, hidden] pre-norm -> [n, vocab] float32 logits (written into ``out`` if given)."""
        return norm_head_logits(self.model.norm, self.lm_head, hidden_states, out)

    def checkpoint_name(self, param_name: str) -> str:
        """``model.embed_tokens`` / ``model.norm`` / ``model.*`` -> ``backbone.embeddings`` / ``backbone.norm_f`` /
        ``backbone.*``; ``mtp.*`` as the MTP stack names its parts (``NemotronHMTP.checkpoint_name``)."""
        name = re.sub(r"^model\.embed_tokens\.", "backbone.embeddings.", param_name)
        name = re.sub(r"^model\.norm\.", "backbone.norm_f.", name)
        if name.startswith("mtp."):
            return "mtp." + self.mtp.checkpoint_name(name.removeprefix("mtp."))
        return re.sub(r"^model\.", "backbone.", name)

    # aux layer capture, the embedding and the greedy head as the Llama family's (models/llama.py)
    greedy_tokens = LlamaForCausalLM.greedy_tokens
    set_aux_hidden_state_layers = LlamaForCausalLM.set_aux_hidden_state_layers
    embed = LlamaForCausalLM.embed
    _model_output = LlamaForCausalLM._model_output
