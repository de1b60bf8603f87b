"""The decoder layer the Llama family (and the drafts built like it) is made of, with the kernels it
chooses: packed q/k/v and gate/up projections, and on the GPU, for few rows, the fused few-row path
(layers/fused_projection.py: four projection kernels around the attention kernel, norms, RoPE, the KV
write and the residual adds folded in). Models compose these and stay eager code; which kernels run
is decided here.

Shapes: flat tokens, ``x`` / ``h`` [num_tokens, hidden]; the attention metadata travels in the
forward context.

Tensor parallelism (outpace/distributed/): built inside ``building_in(group)``, attention splits its
heads over the ranks (q/k/v column-parallel, o row-parallel) and the MLP its intermediate rows (gate/up
column-, down row-parallel): one all-reduce each, the residual stream stays whole on every rank. The
fused few-row kernels read whole weights, so sharded layers take the unfused path.
"""
from __future__ import annotations

import torch
from torch import nn

from outpace.attention.layer import Attention
from outpace.model_config import ModelConfig
from outpace.layers.activation import FUSED_ACTIVATIONS, act_and_mul
from outpace.distributed.group import build_group
from outpace.distributed.sharding import kv_head_shard, split_evenly
from outpace.layers.linear import column_parallel, is_sharded, project, row_parallel
from outpace.layers.norm import RMSNorm
from outpace.layers.rotary import RotaryEmbedding


class DecoderAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, rotary: RotaryEmbedding, input_size: int | None = None,
                 sliding_window: int | None = None) -> None:
        """``sliding_window``: the layer's attention window (ModelConfig.layer_window); None: full."""
        super().__init__()
        self.cfg = cfg
        input_size = input_size or cfg.hidden_size  # EAGLE3's layer reads [embedding, hidden]: 2 * hidden
        d = cfg.head_dim
        p = HeadProjections(input_size, cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, d,
                            cfg.attention_bias, cfg.attention_out_bias)
        heads, kv_heads = p.heads, p.kv_heads
        self.q_size = heads * d  # this rank's q rows: [num_tokens, heads * head_dim]
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = p.q_proj, p.k_proj, p.v_proj, p.o_proj
        if cfg.qk_norm:
            self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
        self.rotary = rotary
        self.attn = Attention(heads, kv_heads, d, sliding_window)
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

    def query(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x [n, in], positions [n] -> q [n, heads, head_dim], normed and rotated (eager)."""
        q = self.q_proj(x).view(x.shape[0], -1, self.cfg.head_dim)
        if self.cfg.qk_norm:
            q = self.q_norm(q)
        q, _ = self.rotary(positions, q, q[:, :0])
        return q

    def key_value(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [n, in], positions [n] -> k, v [n, kv_heads, head_dim], k normed and rotated (eager)."""
        n, d = x.shape[0], self.cfg.head_dim
        k = self.k_proj(x).view(n, -1, d)
        v = self.v_proj(x).view(n, -1, d)
        if self.cfg.qk_norm:
            k = self.k_norm(k)
        _, k = self.rotary(positions, k[:, :0], k)
        return k, v

    def write_kv(self, x: torch.Tensor, positions: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        """k and v of x [n, in] at positions [n] into this layer's paged cache at slot_mapping [n] flat
        slots, without attending (context rows a drafter reads later: DFlash). Few rows on the GPU: the
        fused q/k/v kernel's k/v-only form."""
        k_cache, v_cache = self.attn.kv_cache  # [num_blocks, block_size, kv_heads, head_dim]
        if self.projects_fused(x) and k_cache.is_contiguous() and v_cache.is_contiguous():
            self.project_fused(x, 0.0, positions, k_cache, v_cache, slot_mapping, kv_only=True)
            return
        k, v = self.key_value(x, positions)
        k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, slot_mapping, k.to(k_cache.dtype))
        v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, slot_mapping, v.to(v_cache.dtype))

    def projects_fused(self, x: torch.Tensor) -> bool:
        """Whether one fused kernel (layers/fused_projection.py) projects x [num_tokens, in] to q/k/v
        and writes k and v into a cache: few half-precision rows on the GPU, packed q/k/v without bias,
        per-head q/k norms (if any) over a power-of-two head_dim."""
        head_dim = self.cfg.head_dim
        return (self.qkv is not None and self.qkv.bias is None and not is_sharded(self.o_proj)
                and fusable_rows(x, self.qkv.weight)
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
        weight = self.qkv.weight[self.q_size:] if kv_only else self.qkv.weight
        return norm_project_qkv(rows, eps, weight, cfg.head_dim, 0 if kv_only else self.q_size, positions,
                                self.rotary.cos, self.rotary.sin, k_cache, v_cache, slots, qk_norm=qk_norm)


class HeadProjections:
    """An attention layer's q/k/v and o projections, heads split over the group being built: q (and k, v)
    column-parallel by head, kv heads replicated on size / kv_heads ranks when fewer than ranks
    (distributed/sharding.py ``kv_head_shard``), o row-parallel; ``heads`` / ``kv_heads`` this rank's.
    ``with_v=False``: no v projection (``v_proj`` None: v is k's output, Gemma 4's k = v layers);
    ``with_kv=False``: neither k nor v (a layer attending over another layer's cache)."""

    def __init__(self, input_size: int, hidden_size: int, num_heads: int, num_kv_heads: int, head_dim: int,
                 bias: bool, out_bias: bool, with_kv: bool = True, with_v: bool = True) -> None:
        group, d = build_group(), head_dim
        self.heads = split_evenly(num_heads, group.size, "num_attention_heads")
        first_kv, self.kv_heads = kv_head_shard(num_kv_heads, group.rank, group.size)
        self.q_proj = column_parallel(input_size, num_heads * d, bias, (group.rank * self.heads * d, self.heads * d))
        kv_rows = (first_kv * d, self.kv_heads * d)
        self.k_proj = column_parallel(input_size, num_kv_heads * d, bias, kv_rows) if with_kv else None
        self.v_proj = column_parallel(input_size, num_kv_heads * d, bias, kv_rows) if with_kv and with_v else None
        self.o_proj = row_parallel(num_heads * d, hidden_size, out_bias, "num_attention_heads * head_dim")


class GatedMLP(nn.Module):
    """down_proj(act(gate_proj(x)) * up_proj(x)); ``act`` a key of layers/activation.py's ACTIVATIONS.
    Sharded: each rank holds intermediate_size / size rows of gate and up and the matching columns of down;
    ``reduce=False``: the output is this rank's partial sum, for a caller that all-reduces (an expert)."""

    def __init__(self, hidden_size: int, intermediate_size: int, act: str = "silu", bias: bool = False,
                 reduce: bool = True, what: str = "intermediate_size") -> None:
        super().__init__()
        self.act = act
        self.gate_proj = column_parallel(hidden_size, intermediate_size, bias, what=what)
        self.up_proj = column_parallel(hidden_size, intermediate_size, bias, what=what)
        self.down_proj = row_parallel(intermediate_size, hidden_size, bias, what, reduce)
        self.gate_up: PackedProjection | None = None  # set by pack_projections for serving

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x) if self.gate_up is not None else (self.gate_proj(x), self.up_proj(x))
        return self.down_proj(act_and_mul(self.act, gate, up))

    def fusable(self) -> bool:
        """Whether the fused kernels (``fused_attention_output_and_mlp``: SiLU or GELU-tanh, no biases)
        compute this MLP."""
        return (self.gate_up is not None and self.gate_up.bias is None and self.down_proj.bias is None
                and self.act in FUSED_ACTIVATIONS and not is_sharded(self.down_proj))


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
    """Serve every Llama attention's q/k/v and every MLP's gate/up as one matmul each; also the q/k/v of
    any other attention that asks for it (a ``qkv`` attribute None beside q/k/v_proj: Gemma's)."""
    for module in model.modules():
        if (isinstance(module, DecoderAttention) or getattr(module, "v_proj", None) is not None) \
                and getattr(module, "qkv", False) is None:
            module.qkv = PackedProjection([module.q_proj, module.k_proj, module.v_proj])
        elif isinstance(module, GatedMLP) and module.gate_up is None:
            module.gate_up = PackedProjection([module.gate_proj, module.up_proj])


def unpack_projections(model: nn.Module) -> None:
    """Undo ``pack_projections`` for training: each projection multiplies by its own parameter again (through
    the packed tensor, which its parameter only views, no gradient would reach it)."""
    for module in model.modules():
        if getattr(module, "qkv", None) is not None:
            module.qkv = None
        if isinstance(module, GatedMLP):
            module.gate_up = None


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, rotary: RotaryEmbedding, sliding_window: int | None = None) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = DecoderAttention(cfg, rotary, sliding_window=sliding_window)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size, cfg.hidden_act, cfg.mlp_bias)

    def forward(self, positions: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """h [num_tokens, hidden] -> the layer's output [num_tokens, hidden] (h + attention + MLP)."""
        return residual_stream(*self.forward_residual(positions, h, None))

    def forward_residual(self, positions: torch.Tensor, h: torch.Tensor,
                         residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """vLLM style: the layer's input is h + residual (h alone when residual is None) and so is its
        output, returned as (MLP output, residual) [num_tokens, hidden] each. Each residual add is
        fused into the RMSNorm after it, so a stack of layers never adds the residual on its own.

        Few rows on the GPU take ``forward_fused`` instead, and return (the stream, None)."""
        if self.fuses(h):
            from outpace.layers.fused_projection import normed_rows

            rows = normed_rows(residual_stream(h, residual), self.input_layernorm.weight)
            return self.forward_fused(positions, rows, None), None
        return pre_norm_residual(self, positions, h, residual)

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


def pre_norm_residual(layer: nn.Module, positions: torch.Tensor, h: torch.Tensor,
                      residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The eager pre-norm layer over the stream h + residual (h alone when residual is None), for any
    ``layer`` with input_layernorm, self_attn(positions, x), post_attention_layernorm and mlp modules
    (the DeepSeek layer's are MLA and MoE): (MLP output, residual) [num_tokens, hidden] each, each
    residual add fused into the RMSNorm after it."""
    if residual is None:
        x, residual = layer.input_layernorm(h), h
    else:
        x, residual = layer.input_layernorm(h, residual)
    x, residual = layer.post_attention_layernorm(layer.self_attn(positions, x), residual)
    return layer.mlp(x), residual


def layer_fuses(attn: DecoderAttention, mlp: GatedMLP, x: torch.Tensor) -> bool:
    """Whether the fused kernels compute a layer of this attention and MLP over x [num_tokens, in]:
    ``DecoderAttention.fuses``, and what ``fused_attention_output_and_mlp`` computes (no o_proj bias, a
    ``GatedMLP.fusable`` MLP)."""
    return mlp.fusable() and attn.o_proj.bias is None and attn.fuses(x)


def fused_attention_output_and_mlp(attn: torch.Tensor, stream: torch.Tensor, o_proj: nn.Linear, post_norm: RMSNorm,
                                   mlp: GatedMLP, next_norm: RMSNorm | None):
    """The rest of a decoder layer after attention, fused: attn [n, heads * head_dim], stream [n, hidden]
    (the residual stream) -> the layer's output stream, made ready for ``next_norm`` when given
    (``NormedRows``), else a tensor [n, hidden]. Three projection kernels."""
    from outpace.layers.fused_projection import norm_project_swiglu, project_add, project_add_normed

    mid = project_add_normed(attn, o_proj.weight, stream, post_norm.weight)
    act = norm_project_swiglu(mid, post_norm.eps, mlp.gate_up.weight, act=mlp.act)
    if next_norm is None:
        return project_add(act, mlp.down_proj.weight, mid.stream)
    return project_add_normed(act, mlp.down_proj.weight, mid.stream, next_norm.weight)


def norm_head_logits(norm: RMSNorm, head: nn.Module, hidden: torch.Tensor,
                     out: torch.Tensor | None = None, softcap: float | None = None) -> torch.Tensor:
    """[n, hidden] pre-norm -> [n, vocab] float32 logits: the final norm (any ``norm_offset``), then the
    head (a module with a ``weight`` [vocab, hidden]), soft-capped at ``softcap`` when given (Gemma's
    final_logit_softcapping); one fused kernel for few rows on the GPU. ``out``: a float32 [n, vocab]
    tensor to write them into (returned), instead of a new one."""
    if not is_sharded(head) and fusable_rows(hidden, head.weight):
        from outpace.layers.fused_projection import norm_project, normed_rows

        return norm_project(normed_rows(hidden, norm.weight, norm_offset(norm)), norm.eps, head.weight,
                            out_dtype=torch.float32, out=out, softcap=softcap)
    logits = head(norm(hidden)).float()
    if softcap is not None:
        logits = torch.tanh(logits / softcap) * softcap  # (layers/embedding.py softcap)
    return logits if out is None else out.copy_(logits)


def norm_offset(norm: nn.Module) -> float:
    """What an RMSNorm module adds to its weight (layers/norm.py: Gemma 3's are 1 + w)."""
    return getattr(norm, "offset", 0.0)


def qkv_fuses(attn: nn.Module, x: torch.Tensor) -> bool:
    """Whether ``attend_fused_qkv`` serves an attention module over x [num_tokens, hidden]: its q/k/v
    packed without bias (``pack_projections``), an o_proj without bias, not sharded, per-head q/k norms
    over a power-of-two ``head_dim``, few half-precision rows on the GPU and a backend that attends over
    a cache the kernel wrote."""
    d = attn.head_dim
    return (getattr(attn, "qkv", None) is not None and attn.qkv.bias is None and attn.o_proj.bias is None
            and not is_sharded(attn.o_proj) and d & (d - 1) == 0 and fusable_rows(x, attn.qkv.weight)
            and attn.attn.fused_write_target() is not None)


def attend_fused_qkv(attn: nn.Module, positions: torch.Tensor, rows, eps: float, v_norm: bool = False) -> torch.Tensor:
    """``DecoderAttention.attend_fused`` for another attention module with q_proj/k_proj/v_proj packed
    as ``qkv``, ``q_norm``/``k_norm`` per head (any ``norm_offset``), ``rotary``, ``attn`` and ``head_dim``
    (Gemma's): rows (``NormedRows``) -> the attention output [num_tokens, heads * head_dim] before
    o_proj. ``v_norm``: v heads normalised without a weight (Gemma 4)."""
    from outpace.layers.fused_projection import norm_project_qkv

    k_cache, v_cache, slots = attn.attn.fused_write_target()
    q = norm_project_qkv(rows, eps, attn.qkv.weight, attn.head_dim, attn.qkv.sizes[0], positions, attn.rotary.cos,
                         attn.rotary.sin, k_cache, v_cache, slots,
                         qk_norm=(attn.q_norm.weight, attn.k_norm.weight, attn.k_norm.eps),
                         qk_offset=norm_offset(attn.q_norm), v_norm=v_norm)
    return attn.attn.attend_written(q.view(q.shape[0], -1, attn.head_dim), positions)


def fused_sandwich_rest(attn: torch.Tensor, stream: torch.Tensor, o_proj: nn.Linear, norms: tuple[nn.Module, ...],
                        mlp: GatedMLP, scale: torch.Tensor | None = None) -> torch.Tensor:
    """The rest of a "sandwich" layer after attention (Gemma: a norm before and after attention and the
    MLP), fused: attn [n, heads * head_dim], stream [n, hidden]; norms (post-attention, pre-MLP,
    post-MLP) -> stream + post(o) = mid, then mid + post_mlp(mlp(pre_mlp(mid))), times ``scale`` [1] when
    given (Gemma 4's layer_scalar): [n, hidden]. Two projection kernels that also prepare the norm after
    them, two row kernels that add the normed output to the stream, and the gate/up kernel."""
    from outpace.layers.fused_projection import add_normed, norm_project_swiglu, project_normed

    post_attn, pre_mlp, post_mlp = norms
    o = project_normed(attn, o_proj.weight, post_attn.weight, norm_offset(post_attn))
    mid = add_normed(o, post_attn.eps, stream, (pre_mlp.weight, norm_offset(pre_mlp)))
    act = norm_project_swiglu(mid, pre_mlp.eps, mlp.gate_up.weight, act=mlp.act)
    down = project_normed(act, mlp.down_proj.weight, post_mlp.weight, norm_offset(post_mlp))
    return add_normed(down, post_mlp.eps, mid.stream, scale=scale)


def sandwich_fuses(attn: nn.Module, mlp: GatedMLP, h: torch.Tensor) -> bool:
    """Whether ``fused_sandwich_rest`` and ``attend_fused_qkv`` serve a sandwich layer over h."""
    return mlp.fusable() and qkv_fuses(attn, h)


def sandwich_layer_fused(layer: nn.Module, positions: torch.Tensor, h: torch.Tensor, v_norm: bool = False,
                         scale: torch.Tensor | None = None) -> torch.Tensor:
    """A sandwich layer (``input_layernorm``, ``self_attn``, ``post_attention_layernorm``,
    ``pre_feedforward_layernorm``, ``mlp``, ``post_feedforward_layernorm``) over h [n, hidden] on the
    fused path (``sandwich_fuses``) -> its output [n, hidden] (times ``scale`` when given)."""
    from outpace.layers.fused_projection import normed_rows

    norm = layer.input_layernorm
    attn = attend_fused_qkv(layer.self_attn, positions, normed_rows(h, norm.weight, norm_offset(norm)), norm.eps, v_norm)
    norms = (layer.post_attention_layernorm, layer.pre_feedforward_layernorm, layer.post_feedforward_layernorm)
    return fused_sandwich_rest(attn, h, layer.self_attn.o_proj, norms, layer.mlp, scale)


def fusable_rows(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether the fused few-row kernels (layers/fused_projection.py) serve x [n, in] @ weight.T."""
    if not x.is_cuda:  # (imported only here: Triton is a GPU dependency)
        return False
    from outpace.layers.fused_projection import fused_rows_apply

    return fused_rows_apply(x, weight)


def residual_stream(h: torch.Tensor, residual: torch.Tensor | None) -> torch.Tensor:
    """The value of the residual stream split as (h, residual) by ``forward_residual``: [num_tokens, hidden]."""
    return h if residual is None else h + residual


def embed_norm_pair(token_ids: torch.Tensor, embedding: nn.Embedding, embed_norm: RMSNorm, hidden: torch.Tensor,
                    hidden_norm: RMSNorm, reader: tuple[DecoderAttention, GatedMLP]) -> torch.Tensor:
    """[embed_norm(embedding(token_ids)) | hidden_norm(hidden)], [n, 2 * hidden] (EAGLE3's layer input):
    token_ids [n], hidden [n, hidden]. In one kernel when the layer that reads it (``reader``: its
    attention and MLP) runs fused on these rows."""
    if layer_fuses(*reader, hidden):
        from outpace.layers.fused_projection import embed_norm_pair as fused

        return fused(token_ids, embedding.weight, (embed_norm.weight, embed_norm.eps), hidden,
                     (hidden_norm.weight, hidden_norm.eps))
    return torch.cat((embed_norm(embedding(token_ids)), hidden_norm(hidden)), dim=-1)


def attention_and_mlp(attn: DecoderAttention, mlp: GatedMLP, post_norm: RMSNorm, positions: torch.Tensor,
                      x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """The rest of a layer whose input is already normalised (EAGLE3's [embedding | hidden]): x [n, in],
    residual [n, hidden] -> h + mlp(post_norm(h)) with h = residual + attention(x), [n, hidden]. Few rows
    on the GPU: four projection kernels around attention (layers/fused_projection.py)."""
    if layer_fuses(attn, mlp, x):
        out = attn.attend_fused(positions, x, 0.0)  # (x is normalised: the kernel's input norm is not applied)
        return fused_attention_output_and_mlp(out, residual, attn.o_proj, post_norm, mlp, None)
    h = residual + attn(positions, x)
    return h + mlp(post_norm(h))


def run_layer_stack(layers: list[nn.Module], positions: torch.Tensor, h: torch.Tensor,
                    capture: tuple[int, ...]) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
    """Layers called as ``layer(positions, h) -> h`` (each chooses its own kernels) over h [num_tokens,
    hidden] -> (the last layer's output, {layer index in ``capture``: that layer's input})."""
    captured = {}
    for i, layer in enumerate(layers):
        if i in capture:
            captured[i] = h
        h = layer(positions, h)
    return h, captured


def run_layers(layers: list[DecoderLayer], final_norm: RMSNorm, positions: torch.Tensor, h: torch.Tensor,
               capture: tuple[int, ...]) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
    """A stack of decoder layers over h [num_tokens, hidden] -> (the last layer's output stream
    [num_tokens, hidden], before ``final_norm``; {layer index in ``capture``: that layer's input stream}).

    Few rows on the GPU take the fused path (``DecoderLayer.forward_fused``): each layer hands the next
    its output stream already made ready for the next input norm (``final_norm`` after the last).
    Otherwise each residual add is fused into the RMSNorm after it (``forward_residual``)."""
    captured = {}
    if layers[0].fuses(h):
        from outpace.layers.fused_projection import normed_rows

        norms = [layer.input_layernorm for layer in layers[1:]] + [final_norm]  # the norm after each layer
        rows = normed_rows(h, layers[0].input_layernorm.weight)
        for i, (layer, next_norm) in enumerate(zip(layers, norms)):
            if i in capture:
                captured[i] = rows.stream
            rows = layer.forward_fused(positions, rows, next_norm)
        return rows.stream, captured
    residual = None  # the stream is h + residual
    for i, layer in enumerate(layers):
        if i in capture:
            captured[i] = residual_stream(h, residual)
        h, residual = layer.forward_residual(positions, h, residual)
    return residual_stream(h, residual), captured
