"""The Llama family: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM (attention bias) and
Qwen3ForCausalLM (per-head q/k RMSNorm) share this one implementation.

Forward works on flat tokens: ``input_ids [num_tokens]``, ``positions [num_tokens]``; the
attention metadata travels in the forward context. ``forward`` returns the last hidden state
*before* the final norm (what MTP layers consume); ``compute_logits`` applies norm and head to
only the rows that need logits.

Aux hidden states (for EAGLE3 drafts): capture index i means "the input of layer i"; index
``num_hidden_layers`` means the output of the last layer before the final norm.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import torch
from torch import nn

from outpace.attention.layer import Attention
from outpace.config import ModelConfig
from outpace.layers.activation import act_and_mul
from outpace.layers.embedding import LMHead, VocabEmbedding
from outpace.layers.linear import linear, project
from outpace.layers.norm import RMSNorm
from outpace.layers.rotary import RotaryEmbedding


@dataclass
class ModelOutput:
    hidden_states: torch.Tensor                  # [num_tokens, hidden] last layer's output, pre-norm
    aux_hidden_states: torch.Tensor | None = None  # [num_tokens, num_aux * hidden] captured layer inputs


class LlamaAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, rotary: RotaryEmbedding, input_size: int | None = None,
                 sliding_window: int | None = None) -> None:
        """``sliding_window``: the layer's attention window (ModelConfig.layer_window); None: full."""
        super().__init__()
        self.cfg = cfg
        input_size = input_size or cfg.hidden_size  # EAGLE3's layer reads [embedding, hidden]: 2 * hidden
        self.q_proj = linear(input_size, cfg.q_size, bias=cfg.attention_bias)
        self.k_proj = linear(input_size, cfg.kv_size, bias=cfg.attention_bias)
        self.v_proj = linear(input_size, cfg.kv_size, bias=cfg.attention_bias)
        self.o_proj = linear(cfg.q_size, cfg.hidden_size, bias=cfg.attention_out_bias)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
        self.rotary = rotary
        self.attn = Attention(cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, sliding_window)
        self.qkv: PackedProjection | None = None  # set by pack_projections for serving

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        n, d = x.shape[0], self.cfg.head_dim
        if self.qkv is not None:
            q, k, v = self.qkv(x)
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q = q.view(n, -1, d)  # [num_tokens, heads, head_dim]
        k = k.view(n, -1, d)  # [num_tokens, kv_heads, head_dim]
        v = v.view(n, -1, d)
        if self.cfg.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = self.rotary(positions, q, k)
        return self.o_proj(self.attn(q, k, v, positions))

    def projects_fused(self, x: torch.Tensor) -> bool:
        """Whether one fused kernel (layers/fused_projection.py) projects x [num_tokens, in] to q/k/v
        and writes k and v into a cache: few half-precision rows on the GPU, packed q/k/v without bias,
        per-head q/k norms (if any) over a power-of-two head_dim."""
        head_dim = self.cfg.head_dim
        return (self.qkv is not None and self.qkv.bias is None and _fusable(x, self.qkv.weight)
                and (not self.cfg.qk_norm or head_dim & (head_dim - 1) == 0))

    def fuses(self, x: torch.Tensor) -> bool:
        """Whether ``attend_fused`` serves x [num_tokens, hidden]: ``projects_fused``, and a backend that
        attends over a cache the projection wrote."""
        return self.projects_fused(x) and self.attn.fused_write_target() is not None

    def attend_fused(self, positions: torch.Tensor, rows, eps: float) -> torch.Tensor:
        """rows: the residual stream made ready for the input norm (``NormedRows``, [num_tokens, hidden]),
        or an input already normalised ([num_tokens, input_size]) -> attention output [num_tokens,
        heads * head_dim] (before o_proj). One kernel normalises, projects, applies the q/k norms,
        rotates and writes k and v into the cache; the backend then attends over the cache."""
        q = self.project_fused(rows, eps, positions, *self.attn.fused_write_target())
        return self.attn.attend_written(q.view(q.shape[0], -1, self.cfg.head_dim), positions)

    def project_fused(self, rows, eps: float, positions: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                      slots: torch.Tensor, kv_only: bool = False) -> torch.Tensor:
        """The fused q/k/v kernel (``projects_fused``): k and v of ``rows`` (as in ``attend_fused``) into
        the caches at ``slots`` [num_tokens]; returns q [num_tokens, q_size] ([num_tokens, 0] with
        ``kv_only``, which projects only the k and v rows of the packed weight)."""
        from outpace.layers.fused_projection import norm_project_qkv

        cfg = self.cfg
        q_norm = (self.k_norm if kv_only else self.q_norm) if cfg.qk_norm else None
        qk_norm = (q_norm.weight, self.k_norm.weight, self.k_norm.eps) if cfg.qk_norm else None
        weight = self.qkv.weight[cfg.q_size:] if kv_only else self.qkv.weight
        return norm_project_qkv(rows, eps, weight, cfg.head_dim, 0 if kv_only else cfg.q_size, positions,
                                self.rotary.cos, self.rotary.sin, k_cache, v_cache, slots, qk_norm=qk_norm)


class LlamaMLP(nn.Module):
    """down_proj(act(gate_proj(x)) * up_proj(x)); ``act`` a key of layers/activation.py's ACTIVATIONS."""

    def __init__(self, hidden_size: int, intermediate_size: int, act: str = "silu", bias: bool = False) -> None:
        super().__init__()
        self.act = act
        self.gate_proj = linear(hidden_size, intermediate_size, bias=bias)
        self.up_proj = linear(hidden_size, intermediate_size, bias=bias)
        self.down_proj = linear(intermediate_size, hidden_size, bias=bias)
        self.gate_up: PackedProjection | None = None  # set by pack_projections for serving

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x) if self.gate_up is not None else (self.gate_proj(x), self.up_proj(x))
        return self.down_proj(act_and_mul(self.act, gate, up))

    def fusable(self) -> bool:
        """Whether the fused kernels (``fused_attention_output_and_mlp``: SiLU, no biases) compute this MLP."""
        return (self.gate_up is not None and self.gate_up.bias is None and self.down_proj.bias is None
                and self.act in ("silu", "swish"))


class PackedProjection:
    """Several projections of one input as one matmul (q/k/v; gate/up): their weights are copied into
    one packed tensor and each projection's parameter becomes a view of its rows, so no memory is
    added and checkpoints, training and every other caller still see the separate projections.
    Not an nn.Module: the parameters stay registered where the checkpoint names them."""

    def __init__(self, projections: list[nn.Linear]) -> None:
        self.sizes = [p.out_features for p in projections]
        self.weight = torch.cat([p.weight.data for p in projections])          # [sum(out), in]
        for p, view in zip(projections, self.weight.split(self.sizes)):
            p.weight.data = view
        self.bias = None
        if projections[0].bias is not None:
            self.bias = torch.cat([p.bias.data for p in projections])
            for p, view in zip(projections, self.bias.split(self.sizes)):
                p.bias.data = view

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """x [n, in] -> one [n, out_i] view per projection."""
        return project(x, self.weight, self.bias).split(self.sizes, dim=-1)


def pack_projections(model: nn.Module) -> None:
    """Serve every Llama attention's q/k/v and every MLP's gate/up as one matmul each."""
    for module in model.modules():
        if isinstance(module, LlamaAttention) and module.qkv is None:
            module.qkv = PackedProjection([module.q_proj, module.k_proj, module.v_proj])
        elif isinstance(module, LlamaMLP) and module.gate_up is None:
            module.gate_up = PackedProjection([module.gate_proj, module.up_proj])


class LlamaDecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, rotary: RotaryEmbedding, sliding_window: int | None = None) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = LlamaAttention(cfg, rotary, sliding_window=sliding_window)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = LlamaMLP(cfg.hidden_size, cfg.intermediate_size, cfg.hidden_act, cfg.mlp_bias)

    def forward(self, positions: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """h [num_tokens, hidden] -> the layer's output [num_tokens, hidden] (h + attention + MLP)."""
        return _residual_stream(*self.forward_residual(positions, h, None))

    def forward_residual(self, positions: torch.Tensor, h: torch.Tensor,
                         residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """vLLM style: the layer's input is h + residual (h alone when residual is None) and so is its
        output, returned as (MLP output, residual) [num_tokens, hidden] each. Each residual add is
        fused into the RMSNorm after it, so a stack of layers never adds the residual on its own.

        Few rows on the GPU take ``forward_fused`` instead, and return (the stream, None)."""
        if self.fuses(h):
            from outpace.layers.fused_projection import normed_rows

            rows = normed_rows(_residual_stream(h, residual), self.input_layernorm.weight)
            return self.forward_fused(positions, rows, None), None
        if residual is None:
            x, residual = self.input_layernorm(h), h
        else:
            x, residual = self.input_layernorm(h, residual)
        x, residual = self.post_attention_layernorm(self.self_attn(positions, x), residual)
        return self.mlp(x), residual

    def fuses(self, h: torch.Tensor) -> bool:
        """Whether ``forward_fused`` serves h [num_tokens, hidden] (``layer_fuses``)."""
        return layer_fuses(self.self_attn, self.mlp, h)

    def forward_fused(self, positions: torch.Tensor, rows, next_norm: RMSNorm | None):
        """rows: the layer's input stream made ready for its input norm (``NormedRows``) -> its output
        stream, made ready for ``next_norm`` (the next layer's input norm) when given, else a tensor
        [num_tokens, hidden]. Four projection kernels (norms, RoPE, the KV write, the residual adds and
        SiLU*mul folded in) around the attention kernel."""
        attn = self.self_attn.attend_fused(positions, rows, self.input_layernorm.eps)
        return fused_attention_output_and_mlp(attn, rows.stream, self.self_attn.o_proj, self.post_attention_layernorm,
                                              self.mlp, next_norm)


def layer_fuses(attn: LlamaAttention, mlp: LlamaMLP, x: torch.Tensor) -> bool:
    """Whether the fused kernels compute a layer of this attention and MLP over x [num_tokens, in]:
    ``LlamaAttention.fuses``, and what ``fused_attention_output_and_mlp`` computes (no o_proj bias, a
    ``LlamaMLP.fusable`` MLP)."""
    return mlp.fusable() and attn.o_proj.bias is None and attn.fuses(x)


def fused_attention_output_and_mlp(attn: torch.Tensor, stream: torch.Tensor, o_proj: nn.Linear, post_norm: RMSNorm,
                                   mlp: LlamaMLP, next_norm: RMSNorm | None):
    """The rest of a decoder layer after attention, fused: attn [n, heads * head_dim], stream [n, hidden]
    (the residual stream) -> the layer's output stream, made ready for ``next_norm`` when given
    (``NormedRows``), else a tensor [n, hidden]. Three projection kernels."""
    from outpace.layers.fused_projection import norm_project_swiglu, project_add, project_add_normed

    mid = project_add_normed(attn, o_proj.weight, stream, post_norm.weight)
    act = norm_project_swiglu(mid, post_norm.eps, mlp.gate_up.weight)
    if next_norm is None:
        return project_add(act, mlp.down_proj.weight, mid.stream)
    return project_add_normed(act, mlp.down_proj.weight, mid.stream, next_norm.weight)


def norm_head_logits(norm: RMSNorm, head: nn.Module, hidden: torch.Tensor,
                     out: torch.Tensor | None = None) -> torch.Tensor:
    """[n, hidden] pre-norm -> [n, vocab] float32 logits: the final norm, then the head (a module with
    a ``weight`` [vocab, hidden]); one fused kernel for few rows on the GPU. ``out``: a float32 [n, vocab]
    tensor to write them into (returned), instead of a new one."""
    if _fusable(hidden, head.weight):
        from outpace.layers.fused_projection import norm_project, normed_rows

        return norm_project(normed_rows(hidden, norm.weight), norm.eps, head.weight, out_dtype=torch.float32, out=out)
    logits = head(norm(hidden))
    return logits.float() if out is None else out.copy_(logits)


def _fusable(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether the fused few-row kernels (layers/fused_projection.py) serve x [n, in] @ weight.T."""
    if not x.is_cuda:  # (imported only here: Triton is a GPU dependency)
        return False
    from outpace.layers.fused_projection import fused_rows_apply

    return fused_rows_apply(x, weight)


def _residual_stream(h: torch.Tensor, residual: torch.Tensor | None) -> torch.Tensor:
    """The value of the residual stream split as (h, residual) by ``forward_residual``: [num_tokens, hidden]."""
    return h if residual is None else h + residual


def build_rotary(cfg: ModelConfig) -> RotaryEmbedding:
    return RotaryEmbedding(cfg.head_dim, cfg.max_position_embeddings, cfg.rope_theta, cfg.rope_scaling)


class LlamaModel(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.rotary = build_rotary(cfg)
        self.embed_tokens = VocabEmbedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(cfg, self.rotary, cfg.layer_window(i))
                                    for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class LlamaForCausalLM(nn.Module):
    # Checkpoint tensors that are legitimately not parameters here.
    ignored_checkpoint_tensors = (r"\.rotary_emb\.inv_freq$",)

    def __init__(self, cfg: ModelConfig, mtp_own_heads: bool = False) -> None:
        """``mtp_own_heads``: the MTP layers carry their own embedding and shared head (DeepSeek-V3
        layout; the loader decides from the checkpoint's tensor names, models/mtp.py)."""
        super().__init__()
        self.config = cfg
        self.model = LlamaModel(cfg)
        self.lm_head = LMHead(cfg.hidden_size, cfg.vocab_size,
                              tied_to=self.model.embed_tokens if cfg.tie_word_embeddings else None)
        self.aux_layer_ids: tuple[int, ...] = ()
        if cfg.num_nextn_predict_layers:
            from outpace.models.mtp import build_mtp_layers

            self.mtp_layers = build_mtp_layers(cfg, self.model.rotary, mtp_own_heads)

    def set_aux_hidden_state_layers(self, layer_ids: tuple[int, ...]) -> None:
        """Capture the inputs of these layers (index num_hidden_layers: the last layer's output)."""
        bad = [i for i in layer_ids if not 0 <= i <= self.config.num_hidden_layers]
        if bad:
            raise ValueError(f"aux hidden state layer ids {bad} are out of range: the target has "
                             f"{self.config.num_hidden_layers} layers, so ids must be in "
                             f"[0, {self.config.num_hidden_layers}]")
        self.aux_layer_ids = tuple(layer_ids)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_tokens(input_ids)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> ModelOutput:
        h, residual = self.embed(input_ids), None  # [num_tokens, hidden]; the stream is h + residual
        if self.model.layers[0].fuses(h):
            return self._forward_fused(positions, h)
        captured = {}
        for i, layer in enumerate(self.model.layers):
            if i in self.aux_layer_ids:
                captured[i] = _residual_stream(h, residual)
            h, residual = layer.forward_residual(positions, h, residual)
        return self._model_output(_residual_stream(h, residual), captured)

    def _forward_fused(self, positions: torch.Tensor, h: torch.Tensor) -> ModelOutput:
        """``forward`` through the layers' fused path: each layer hands the next its output stream
        already made ready for the next input norm."""
        from outpace.layers.fused_projection import normed_rows

        layers = self.model.layers
        norms = [layer.input_layernorm for layer in layers[1:]] + [self.model.norm]  # the norm after each layer
        rows, captured = normed_rows(h, layers[0].input_layernorm.weight), {}
        for i, (layer, next_norm) in enumerate(zip(layers, norms)):
            if i in self.aux_layer_ids:
                captured[i] = rows.stream
            rows = layer.forward_fused(positions, rows, next_norm)
        return self._model_output(rows.stream, captured)

    def _model_output(self, h: torch.Tensor, captured: dict[int, torch.Tensor]) -> ModelOutput:
        """h [num_tokens, hidden], the last layer's output; captured: layer index -> its input stream."""
        captured[len(self.model.layers)] = h
        aux = [captured[i] for i in self.aux_layer_ids]  # in the drafter's order, repeats allowed
        return ModelOutput(h, torch.cat(aux, dim=-1) if aux else None)

    def compute_logits(self, hidden_states: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """[n, hidden] pre-norm hidden states -> [n, vocab] float32 logits (written into ``out`` if given)."""
        return norm_head_logits(self.model.norm, self.lm_head, hidden_states, out)

    # Checkpoint names: MTP layers are stored DeepSeek-V3 style after the decoder layers.
    def checkpoint_name(self, param_name: str) -> str:
        m = re.match(r"mtp_layers\.(\d+)\.(.*)", param_name)
        if m:
            return f"model.layers.{self.config.num_hidden_layers + int(m.group(1))}.{m.group(2)}"
        return param_name
