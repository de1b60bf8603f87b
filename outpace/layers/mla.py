"""Multi-head latent attention (DeepSeek-V2/V3), over a paged cache of one latent row per token.

Per token (names as transformers' DeepseekV3Attention and the checkpoints give them):
- queries: ``q_proj(x)``, or ``q_b_proj(q_a_layernorm(q_a_proj(x)))`` with a q_lora_rank; per head a
  ``qk_nope_head_dim`` part (q_nope) and a rotated ``qk_rope_head_dim`` part (q_pe);
- keys and values: ``kv_a_proj_with_mqa(x)`` gives the latent c (``kv_lora_rank``, then
  ``kv_a_layernorm``) and one rotated key part k_pe shared by all heads; ``kv_b_proj`` (W_UK and W_UV,
  per head) expands c into k_nope [qk_nope_head_dim] and v [v_head_dim];
- score of a key: q_nope . k_nope + q_pe . k_pe, times ``scale``; output ``o_proj`` of the heads' values.

The cache keeps only [c, k_pe] per token (kv_lora_rank + qk_rope_head_dim values, one "head"), never
the per-head keys and values; an FP8 cache stores the row quantized with the layer's one ``k_scale``
(attention/kv_quant.py), and every reader dequantizes it (the Triton kernel in place). Two forms read
it, equal in exact arithmetic:
- absorbed (decode, verify): q_nope . (W_UK c) = (W_UK^T q_nope) . c, so each head's query becomes
  [W_UK^T q_nope, q_pe] over the cached rows [c, k_pe], the values are the latents themselves, and W_UV
  is applied to each head's attended latent afterwards (one kv head for all query heads, GQA style);
- expanded (prefill): the sequences' cached latents go through kv_b_proj into per-head keys and values.
Absorbed costs H * r * (nope + v) per query more and H * (2r - nope - v) per (query, key) pair less than
expanded, which costs H * r * (nope + v) per key (H heads, r = kv_lora_rank): expanding wins once a
sequence brings more than r * (nope + v) / (2r - nope - v) queries (171 for DeepSeek-V3), so a forward
expands when its longest query run reaches that (``expand_min_query_len``).

The absorbed form attends in the kernel of attention/mla_kernels.py when the forward context's backend is
Triton (CUDA by default; no host synchronisation, so decode and verify forwards are captured in CUDA graphs),
else with the torch backend's paged helpers (block gather, masks for causal and tree verify); the expanded
form always with the latter. Few half-precision rows on the GPU under the Triton backend (decode, verify)
take the fused path of layers/mla_fused.py instead (``fuses``): the whole block in five launches, the
eager modules staying the CPU path and the reference.

Batch-invariant mode (EngineConfig.batch_invariant): on the GPU the fused block serves every absorbed
forward, whatever its rows (layers/mla_fused.py's docstring says why its rows keep their bits). Elsewhere (the
CPU, the torch backend) the absorbed form's kernel runs with fixed tiles and an absolute split partition
(attention/mla_kernels.py; a tree node walked over its logical rows), and its per-head products W_UK^T q_nope
and W_UV a go head by head through ``project`` (``heads_apart``), so a decode row gets the bits it gets
inside a verify chain or any batch. The expanded form (a forward whose query run reaches
``expand_min_query_len``) is not covered.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from outpace.attention.context import batch_invariant, get_forward_context
from outpace.attention.kv_quant import dequantize, store
from outpace.attention.layer import PagedCacheLayer
from outpace.attention.metadata import DenseCausalMetadata, PagedAttentionMetadata
from outpace.attention.torch_backend import attend_paged, gather_blocks
from outpace.distributed.group import build_group
from outpace.distributed.sharding import split_evenly
from outpace.layers.fused_decoder import ends_block, fusable_rows
from outpace.layers.linear import column_parallel, linear, project, row_parallel
from outpace.layers.norm import RMSNorm
from outpace.layers.quant.linear import Fp8Block, Fp8Tensor, is_quantized
from outpace.layers.quant.scheme import FP8_BLOCK
from outpace.layers.rotary import RotaryEmbedding


@dataclass(frozen=True)
class MLAShape:
    hidden_size: int
    num_heads: int
    q_lora_rank: int | None  # None: one q_proj
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    scale: float  # softmax scale (qk_head_dim ** -0.5, YaRN's mscale folded in)
    bias: bool = False  # attention_bias: on q_a_proj, kv_a_proj_with_mqa and o_proj (transformers)

    @property
    def expand_min_query_len(self) -> int | float:
        """Queries per sequence from which the expanded form costs fewer multiplies (module docstring)."""
        r, nope, v = self.kv_lora_rank, self.qk_nope_head_dim, self.v_head_dim
        return math.ceil(r * (nope + v) / (2 * r - nope - v)) if 2 * r > nope + v else math.inf


def fused_weight_format(proj: nn.Module, dtype: torch.dtype) -> str | None:
    """How layers/mla_fused.py's kernels read projection ``proj``'s weight for rows of ``dtype``: "none"
    (a contiguous weight of that dtype), "fp8_block" (block FP8 whose scale blocks span a power of two
    >= 16 columns, so that each K step of the kernels, a power of two, lies in one scale column: the
    published checkpoints' 128 x 128; or per-tensor FP8, Mistral Small 4's, read as such blocks: layers/mla_fused.py
    ``_operand``), or None: they cannot."""
    if not is_quantized(proj):
        return "none" if proj.weight.dtype == dtype and proj.weight.is_contiguous() else None
    if isinstance(proj.format, Fp8Tensor) and proj.stored_weight.is_contiguous():
        return FP8_BLOCK
    block_k = proj.format.scheme.block[1] if isinstance(proj.format, Fp8Block) else 0
    if block_k >= 16 and block_k & (block_k - 1) == 0 and proj.stored_weight.is_contiguous():
        return proj.format.scheme.method
    return None


# transformers builds q_a_layernorm and kv_a_layernorm as DeepseekV3RMSNorm(rank): its default eps, not the config's.
_LATENT_NORM_EPS = 1e-6


class MultiHeadLatentAttention(PagedCacheLayer):
    """Tensor parallelism (outpace/distributed/), as vLLM's and SGLang's DeepseekV2MLAAttention shard it: the
    heads split over the ranks (q_proj / q_b_proj and kv_b_proj column-parallel by head, o_proj row-parallel,
    one all-reduce); the down projections q_a_proj and kv_a_proj_with_mqa are replicated, so every rank
    computes and caches the whole latent row of each token (the cache is one "head" shared by all heads).
    ``shape`` is then this rank's: ``num_heads`` the heads it holds."""

    def __init__(self, shape: MLAShape, rotary: RotaryEmbedding) -> None:
        super().__init__()
        s = shape
        heads = split_evenly(s.num_heads, build_group().size, "num_attention_heads")
        self.shape = dataclasses.replace(shape, num_heads=heads)
        qk_head_dim = s.qk_nope_head_dim + s.qk_rope_head_dim
        if s.q_lora_rank is None:
            self.q_proj = column_parallel(s.hidden_size, s.num_heads * qk_head_dim)
        else:
            self.q_a_proj = linear(s.hidden_size, s.q_lora_rank, bias=s.bias)
            self.q_a_layernorm = RMSNorm(s.q_lora_rank, _LATENT_NORM_EPS)
            self.q_b_proj = column_parallel(s.q_lora_rank, s.num_heads * qk_head_dim)
        self.kv_a_proj_with_mqa = linear(
            s.hidden_size, s.kv_lora_rank + s.qk_rope_head_dim, bias=s.bias
        )
        self.kv_a_layernorm = RMSNorm(s.kv_lora_rank, _LATENT_NORM_EPS)
        self.kv_b_proj = column_parallel(
            s.kv_lora_rank, s.num_heads * (s.qk_nope_head_dim + s.v_head_dim)
        )
        self.o_proj = row_parallel(
            s.num_heads * s.v_head_dim, s.hidden_size, s.bias, "num_attention_heads"
        )
        self.rotary = rotary
        self.expand_min_query_len = s.expand_min_query_len
        self.cache_rows: torch.Tensor | None = (
            None  # [num_blocks, block_size, 1, kv_lora_rank + qk_rope_head_dim]
        )
        # a kv_b_proj stored quantized, dequantized once after loading (``pack_rows``)
        self.kv_b_dequantized: torch.Tensor | None = None  # [heads * (nope + v), kv_lora_rank]
        self.register_kv_scales()  # k_scale: an FP8 cache's rows, key and value alike (kv_quant.py)

    def latent_scale(self) -> torch.Tensor | None:
        """The k scale an FP8 latent cache is read with; None for a cache in the model's dtype."""
        return self.k_scale if self.fp8_cache else None

    def bind_cache(
        self, num_blocks: int, block_size: int, dtype: torch.dtype, device: torch.device | str
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One row [c, k_pe] per token, kept whole as ``cache_rows``; ``kv_cache`` is its two views (latent
        [.., 1, kv_lora_rank], rope [.., 1, qk_rope_head_dim]), so callers that copy a (k, v) pair of rows
        copy the whole row."""
        r = self.shape.kv_lora_rank
        self.cache_rows = torch.zeros(
            num_blocks, block_size, 1, r + self.shape.qk_rope_head_dim, dtype=dtype, device=device
        )
        self.kv_cache = (self.cache_rows[..., :r], self.cache_rows[..., r:])
        return self.kv_cache

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """positions [num_tokens]; x [num_tokens, hidden] -> [num_tokens, hidden]. Writes the tokens' cache rows
        (paged metadata; under dense causal metadata, as training runs, nothing is cached: the expanded form)."""
        s, n = self.shape, x.shape[0]
        meta = get_forward_context().metadata
        if not isinstance(meta, (PagedAttentionMetadata, DenseCausalMetadata)):
            raise TypeError(
                f"multi-head latent attention needs paged or dense causal metadata, not {type(meta)}"
            )
        if self.fuses(x):
            from outpace.layers.mla_fused import mla_forward_fused  # Triton: a GPU dependency

            return mla_forward_fused(self, positions, x, meta)
        q = (
            self.q_proj(x)
            if s.q_lora_rank is None
            else self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        )
        q_nope, q_pe = q.view(n, s.num_heads, -1).split(
            [s.qk_nope_head_dim, s.qk_rope_head_dim], dim=-1
        )
        latent, k_pe = self.kv_a_proj_with_mqa(x).split(
            [s.kv_lora_rank, s.qk_rope_head_dim], dim=-1
        )
        q_pe, k_pe = self.rotary(
            positions, q_pe, k_pe.unsqueeze(1)
        )  # [n, heads, rope], [n, 1, rope]
        # a query scale by position (Mistral 4) multiplies the whole query: the rotary scaled q_pe
        q_nope = self.rotary.scale_queries(q_nope, positions)
        rows = torch.cat(
            (self.kv_a_layernorm(latent).unsqueeze(1), k_pe), dim=-1
        )  # [n, 1, r + rope]
        if isinstance(
            meta, DenseCausalMetadata
        ):  # training and teacher forwards: whole windows, no cache
            return self.o_proj(self._dense_causal(q_nope, q_pe, rows, meta).reshape(n, -1))
        cache = self.cache_rows
        store(cache, meta.slot_mapping, rows, self.k_scale)
        if meta.max_query_len >= self.expand_min_query_len:
            gathered = dequantize(gather_blocks(cache, meta), self.latent_scale(), x.dtype)
            out = self._expanded(q_nope, q_pe, gathered, meta)
        else:
            out = self._absorbed(q_nope, q_pe, meta)
        return self.o_proj(out.reshape(n, -1))  # out [n, heads, v_head_dim]

    # The fused block (layers/mla_fused.py); tests switch it off to compare with the eager chain.
    fused: bool = True

    def fuses(self, x: torch.Tensor) -> bool:
        """Whether layers/mla_fused.py computes this forward over x [num_tokens, hidden] (when ``fused``):
        few rows of half precision on the GPU (``fusable_rows``: any number in batch-invariant mode, whose
        invariance layers/mla_fused.py's docstring argues), the absorbed form under the Triton backend over a
        contiguous cache, and weights without biases. Under tensor parallelism the kernels read this rank's
        heads (``shape``: q_b_proj's rows and kv_b_proj's of its heads, the replicated down-projections whole),
        and o_proj, a row-parallel module that reduces itself (``ends_block``), sums the ranks' partial
        outputs.

        Quantized projections: the two fused kernels read q_a_proj, kv_a_proj_with_mqa and q_b_proj (or
        q_proj) themselves, as stored in x's dtype, in block FP8 or in per-tensor FP8 (read as blocks:
        ``fused_weight_format``); any other format of these (INT4 groups) takes the eager path, whose
        projections have kernels of their own. kv_b_proj and o_proj may be stored in any format: the fused block reads W_UK and W_UV
        through ``up_weights`` (a quantized kv_b_proj dequantized once after loading, as the eager path
        reads it) and calls o_proj as a module (the few-row quantized kernel for a quantized one)."""
        ctx = get_forward_context()
        meta = ctx.metadata
        return (
            self.fused
            and isinstance(meta, PagedAttentionMetadata)
            and meta.max_query_len < self.expand_min_query_len
            and ctx.backend.name == "triton"
            and not self.shape.bias
            and ends_block(self.o_proj)
            and all(fused_weight_format(p, x.dtype) for p in self.fused_projections())
            and self.cache_rows is not None
            and self.cache_rows.is_contiguous()
            # the norm's weight, in the model's dtype: the rows' dtype checked against it
            and fusable_rows(x, self.kv_a_layernorm.weight)
        )

    def attend_rows(self, positions: torch.Tensor, rows, eps: float) -> torch.Tensor:
        """The fused block up to o_proj, for a fused residual stack (``fuses``; models/deepseek.py): positions
        [num_tokens]; rows, the layer's input stream made ready for its input norm of eps ``eps``
        (layers/normed_rows.py ``NormedRows``: the norm folded into the down projections) or its input
        normalised [num_tokens, hidden] -> the heads' attended values [num_tokens, heads * v_head_dim]
        (o_proj's input). Writes the tokens' cache rows."""
        from outpace.layers.mla_fused import mla_attend_fused  # Triton: a GPU dependency

        return mla_attend_fused(self, positions, rows, eps, get_forward_context().metadata)

    def fused_projections(self) -> tuple[nn.Module, ...]:
        """The projections whose weights layers/mla_fused.py's kernels read as stored."""
        if self.shape.q_lora_rank is None:
            return (self.q_proj, self.kv_a_proj_with_mqa)
        return (self.q_a_proj, self.q_b_proj, self.kv_a_proj_with_mqa)

    def pack_rows(self) -> None:
        """After loading (layers/decoder.py ``pack_projections``): a kv_b_proj stored quantized is dequantized
        once, to the latent's dtype, for the absorbed form's W_UK and W_UV, instead of at every decode step
        (vLLM's MLA keeps them dequantized the same way, from ``process_weights_after_loading``)."""
        if is_quantized(self.kv_b_proj):
            self.kv_b_dequantized = self._dequantized_kv_b()

    def _dequantized_kv_b(self) -> torch.Tensor:
        return self.kv_b_proj.dequantized().to(self.kv_a_layernorm.weight.dtype)

    def up_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """kv_b_proj's weight split per head: W_UK [heads, nope, r] and W_UV [heads, v, r]."""
        s = self.shape
        if not is_quantized(self.kv_b_proj):
            w = self.kv_b_proj.weight
        elif self.kv_b_dequantized is not None:
            w = self.kv_b_dequantized
        else:  # (a model built without the loader's packing)
            w = self._dequantized_kv_b()
        w = w.view(s.num_heads, s.qk_nope_head_dim + s.v_head_dim, s.kv_lora_rank)
        return w.split([s.qk_nope_head_dim, s.v_head_dim], dim=1)

    def _absorbed(
        self, q_nope: torch.Tensor, q_pe: torch.Tensor, meta: PagedAttentionMetadata
    ) -> torch.Tensor:
        """q_nope [n, heads, nope], q_pe [n, heads, rope], the new tokens' rows already cached -> [n, heads,
        v_head_dim], attending in latent space: the Triton kernel under the Triton backend, else torch."""
        w_uk, w_uv = self.up_weights()
        invariant = batch_invariant()
        if invariant:
            q_latent = heads_apart(q_nope, w_uk.transpose(1, 2))  # [n, heads, r]
        else:
            q_latent = torch.einsum("thd,hdr->thr", q_nope, w_uk)  # [n, heads, r]
        if get_forward_context().backend.name == "triton":
            from outpace.attention.mla_kernels import (
                mla_paged_attention,  # Triton: installed with that backend
            )

            # (batch-invariant in that mode: attention/mla_kernels.py, tree drafts refused there)
            attended = mla_paged_attention(
                q_latent,
                q_pe,
                self.cache_rows,
                meta,
                self.shape.scale,
                k_scale=self.latent_scale(),
            )
        else:
            r = self.shape.kv_lora_rank
            gathered = dequantize(
                gather_blocks(self.cache_rows, meta), self.latent_scale(), q_latent.dtype
            )  # [num_seqs, 1, max_kv_len, r + rope]
            attended = attend_paged(
                torch.cat((q_latent, q_pe), dim=-1),
                gathered,
                gathered[..., :r],
                meta,
                self.shape.scale,
            )  # [n, heads, r]
        if invariant:
            return heads_apart(attended, w_uv)
        return torch.einsum("thr,hvr->thv", attended, w_uv)

    def _expanded(
        self,
        q_nope: torch.Tensor,
        q_pe: torch.Tensor,
        gathered: torch.Tensor,
        meta: PagedAttentionMetadata,
    ) -> torch.Tensor:
        """As ``_absorbed``, with the cached latents expanded into per-head keys and values."""
        k, v = self._expand(gathered)
        return attend_paged(torch.cat((q_nope, q_pe), dim=-1), k, v, meta, self.shape.scale)

    def _expand(self, gathered: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Latent rows [num_seqs, 1, kv_len, r + rope] -> per-head k [num_seqs, heads, kv_len, nope + rope] and v
        [num_seqs, heads, kv_len, v_head_dim]."""
        s = self.shape
        latent, k_pe = gathered.split([s.kv_lora_rank, s.qk_rope_head_dim], dim=-1)
        kv = self.kv_b_proj(latent).unflatten(
            -1, (s.num_heads, -1)
        )  # [num_seqs, 1, max_kv_len, heads, nope + v]
        kv = kv.squeeze(1).transpose(1, 2)  # [num_seqs, heads, max_kv_len, nope + v]
        k_nope, v = kv.split([s.qk_nope_head_dim, s.v_head_dim], dim=-1)
        return torch.cat((k_nope, k_pe.expand(-1, s.num_heads, -1, -1)), dim=-1), v

    def _dense_causal(
        self,
        q_nope: torch.Tensor,
        q_pe: torch.Tensor,
        rows: torch.Tensor,
        meta: DenseCausalMetadata,
    ) -> torch.Tensor:
        """The expanded form over ``meta.batch_size`` whole windows of ``meta.seq_len`` tokens (rows [n, 1, r + rope]
        this forward's own, nothing cached) -> [n, heads, v_head_dim]."""
        b, t, h = meta.batch_size, meta.seq_len, self.shape.num_heads
        k, v = self._expand(rows.view(b, t, 1, -1).transpose(1, 2))  # [b, heads, t, .]
        q = torch.cat((q_nope, q_pe), dim=-1).view(b, t, h, -1).transpose(1, 2)
        out = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, scale=self.shape.scale
        )  # [b, heads, t, v]
        return out.transpose(1, 2).reshape(b * t, h, -1)


def heads_apart(x: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """x [n, heads, in] through each head's own weights [heads, out, in] -> [n, heads, out], head by head
    through layers/linear.py's ``project``: the batch-invariant mode's form of the per-head products of the
    absorbed attention (a batched product, as einsum's, picks its kernel by n on cuBLAS and CPU BLAS). On CUDA
    all heads in one launch of the mode's kernel, with the bits ``project`` gives head by head (which took a
    launch a head, and a copy of a transposed weight: about 50 launches a layer for DeepSeek-V2-Lite's 16 heads,
    where its batch-1 decode step ran at 0.32x the normal path's in the mode, gpu_2026-11-30d call 4)."""
    if x.is_cuda:
        from outpace.layers.skinny_gemm import skinny_linear_heads  # Triton: only where a GPU runs

        return skinny_linear_heads(x, weights)
    return torch.stack([project(x[:, h], weights[h]) for h in range(x.shape[1])], dim=1)
