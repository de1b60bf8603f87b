"""Llama-family stacks whose MLP is a mixture of experts on some layers (models/qwen2_moe.py, models/qwen3_moe.py):
which layers (``mixture_layers``), the layer (``MixtureLayer``) and the stack's forward (``MixtureStack``).

A mixture block here is any module with this rank's output ``partial(x, ready, row_norm)``, its rank ``group``
and ``takes_normed_rows(x)`` (layers/moe.py ``MoE``, layers/gated_shared_moe.py ``SparseMoeWithSharedExpert``).
Few rows on the GPU take the fused residual stack (layers/fused_decoder.py ``run_stack``) where every layer
does: the attention block as the Llama layer's (the input norm folded into q/k/v, o_proj adding the residual), a
dense MLP as the Llama layer's, a mixture as ``moe_block_fused`` runs it (on one GPU the post-attention norm
folded into routing and gate/up, the next layer's norm readied by the experts' combine).
"""

from __future__ import annotations

import torch
from torch import nn

from outpace.layers import fused_decoder
from outpace.layers.fused_decoder import FusedDecoderLayer
from outpace.layers.rotary import RotaryEmbedding
from outpace.model_config import ModelConfig
from outpace.models.llama import ModelOutput
from outpace.validation import is_int, require


def mixture_layers(cfg: ModelConfig, num_experts: int) -> frozenset[int]:
    """The layers whose MLP is the mixture, as transformers' Qwen2MoeDecoderLayer and Qwen3MoeDecoderLayer
    place it: where num_experts > 0, off ``mlp_only_layers``, on every ``decoder_sparse_step``-th layer."""
    raw, o = cfg.raw, "ModelConfig"
    step, dense = raw.get("decoder_sparse_step", 1), raw.get("mlp_only_layers") or []
    require(o, "decoder_sparse_step", step, is_int(step) and step > 0, "a positive integer")
    require(
        o,
        "mlp_only_layers",
        dense,
        isinstance(dense, list) and all(is_int(i) for i in dense),
        "a list of layer indices",
    )
    return frozenset(
        i
        for i in range(cfg.num_hidden_layers)
        if num_experts > 0 and i not in dense and (i + 1) % step == 0
    )


def expert_counts(
    experts, top_k, experts_field: str = "num_experts", dense_allowed: bool = True
) -> tuple[int, int]:
    """A config's expert count and top-k, checked and named in errors: a count >= 0 (0: no mixture, where
    ``dense_allowed``; else > 0) and a top-k in [1, count]."""
    o = "ModelConfig"
    if dense_allowed:
        require(o, experts_field, experts, is_int(experts) and experts >= 0, "an integer >= 0")
    else:
        require(o, experts_field, experts, is_int(experts) and experts > 0, "a positive integer")
    require(
        o,
        "num_experts_per_tok",
        top_k,
        is_int(top_k) and (experts == 0 or 0 < top_k <= experts),
        f"an integer in [1, {experts_field}={experts}]",
    )
    return experts, top_k


class MixtureLayer(FusedDecoderLayer):
    """A Llama-family layer (``FusedDecoderLayer``) whose MLP is ``mixture`` where given (module docstring)."""

    def __init__(
        self,
        cfg: ModelConfig,
        rotary: RotaryEmbedding,
        sliding_window: int | None,
        mixture: nn.Module | None,
    ) -> None:
        super().__init__(cfg, rotary, sliding_window)
        self.is_moe = mixture is not None
        if self.is_moe:
            self.mlp = mixture

    def fuses(self, h: torch.Tensor) -> bool:
        """``FusedDecoderLayer.fuses``; a mixture's layer: the attention block's fused path and an o_proj
        without bias whose weight the fused kernels serve on these rows (``fusable_output``: a block-FP8 one
        through its quantized product), the block itself materialising its input (``moe_block_fused``)."""
        if not self.is_moe:
            return super().fuses(h)
        attn = self.self_attn
        o_weight = fused_decoder.fused_weight(attn.o_proj)
        return (
            attn.o_proj.bias is None
            and o_weight is not None
            and fused_decoder.fusable_output(h, o_weight)
            and fused_decoder.attention_fuses(attn, h)
        )

    def forward_fused(self, positions: torch.Tensor, rows, next_norm: nn.Module):
        """``FusedDecoderLayer.forward_fused``; a mixture's layer runs its block as layers/fused_decoder.py
        ``moe_block_fused`` (module docstring)."""
        if not self.is_moe:
            return super().forward_fused(positions, rows, next_norm)
        attn, mixture = self.self_attn, self.mlp
        out = fused_decoder.attend_fused(attn, positions, rows, self.input_layernorm.eps)
        return fused_decoder.moe_block_fused(
            out,
            attn.o_proj,
            rows.stream,
            self.post_attention_layernorm,
            next_norm,
            mixture.partial,
            mixture.takes_normed_rows(rows.stream),
            mixture.group,
        )


class MixtureStack:
    """The forward of a Llama-family model (this mixin before it) over a stack of dense and mixture layers."""

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> ModelOutput:
        """``LlamaForCausalLM.forward``, the fused residual stack only where every layer takes it
        (``run_stack``: the layers differ), else the eager one."""
        layers = self.model.layers
        h, captured = fused_decoder.run_stack(
            list(layers),
            [layer.input_layernorm for layer in layers],
            self.model.norm,
            positions,
            self.embed(input_ids),
            self.aux_layer_ids,
        )
        return self._model_output(h, captured)
