"""Qwen3MoeForCausalLM (Qwen3-30B-A3B, Qwen3-235B-A22B, the Qwen3-Coder MoE models): Qwen3's layers
(models/qwen3.py: per-head q/k RMSNorm; a sliding window on every layer with use_sliding_window) whose MLP is a sparse mixture of experts on
every ``decoder_sparse_step``-th layer outside ``mlp_only_layers`` (transformers Qwen3MoeDecoderLayer; vLLM's
qwen3_moe.py alike), a dense SwiGLU MLP of ``intermediate_size`` on the others.

The mixture (transformers Qwen3MoeSparseMoeBlock and Qwen3MoeTopKRouter): a softmax over the router's logits
keeps ``num_experts_per_tok`` experts, their probabilities renormalised with ``norm_topk_prob``, no shared
expert: layers/moe.py ``MoE`` with none, its ``Router`` scoring in float32. Checkpoint names are the hub's
(``mlp.gate.weight``, ``mlp.experts.{e}.{gate,up,down}_proj.weight``, which transformers' save_pretrained
writes too); transformers 5 writes the expert count as ``num_local_experts``, the hub's configs as
``num_experts``.

Few rows on the GPU take the fused residual stack (layers/fused_decoder.py ``run_stack``): the attention block
as the Llama layer's (the input norm folded into q/k/v with the q/k norms, RoPE and the cache write; o_proj
adding the residual), a dense MLP as the Llama layer's, and a mixture as ``moe_block_fused`` runs it (on one GPU
the post-attention norm folded into routing and gate/up, the next layer's norm readied by the experts'
combine).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from outpace.layers import fused_decoder
from outpace.layers.decoder import GatedMLP
from outpace.layers.fused_decoder import FusedDecoderLayer
from outpace.layers.moe import MoE, Routing, takes_normed_rows
from outpace.layers.rotary import RotaryEmbedding
from outpace.model_config import ModelConfig
from outpace.models.config_hooks import empty_if_all_full
from outpace.models.qwen3 import Qwen3ForCausalLM
from outpace.validation import ConfigFields, is_int, require


@dataclass(frozen=True)
class Qwen3MoeConfig:
    """The mixture's fields of a Qwen3MoeConfig beyond ``ModelConfig``'s."""

    routing: Routing
    moe_intermediate_size: int
    moe_layers: frozenset[int]  # the layers whose MLP is the mixture

    @classmethod
    def from_model_config(cls, cfg: ModelConfig) -> Qwen3MoeConfig:
        raw, o = cfg.raw, "ModelConfig"
        experts = raw.get("num_experts", raw.get("num_local_experts", 128))
        top_k = raw.get("num_experts_per_tok", 8)
        step = raw.get("decoder_sparse_step", 1)
        dense = raw.get("mlp_only_layers") or []
        size = raw.get("moe_intermediate_size", 768)
        require(o, "num_experts", experts, is_int(experts) and experts >= 0, "an integer >= 0")
        require(
            o,
            "num_experts_per_tok",
            top_k,
            is_int(top_k) and (experts == 0 or 0 < top_k <= experts),
            f"an integer in [1, num_experts={experts}]",
        )
        require(o, "decoder_sparse_step", step, is_int(step) and step > 0, "a positive integer")
        require(o, "moe_intermediate_size", size, is_int(size) and size > 0, "a positive integer")
        require(
            o,
            "mlp_only_layers",
            dense,
            isinstance(dense, list) and all(is_int(i) for i in dense),
            "a list of layer indices",
        )
        return cls(
            routing=Routing(
                max(experts, 1),
                max(top_k, 1),
                "softmax",
                normalize=bool(raw.get("norm_topk_prob", False)),
            ),
            moe_intermediate_size=size,
            # transformers Qwen3MoeDecoderLayer: a mixture where num_experts > 0, off mlp_only_layers, on every
            # decoder_sparse_step-th layer
            moe_layers=frozenset(
                i
                for i in range(cfg.num_hidden_layers)
                if experts > 0 and i not in dense and (i + 1) % step == 0
            ),
        )


class Qwen3MoeDecoderLayer(FusedDecoderLayer):
    """Qwen3's layer (``FusedDecoderLayer``) with the mixture as its MLP where ``moe`` is given."""

    def __init__(
        self,
        cfg: ModelConfig,
        rotary: RotaryEmbedding,
        sliding_window: int | None,
        moe: Qwen3MoeConfig | None,
    ) -> None:
        super().__init__(cfg, rotary, sliding_window)
        self.is_moe = moe is not None
        if self.is_moe:

            def mlp(size: int, bias: bool, **shard) -> GatedMLP:
                return GatedMLP(cfg.hidden_size, size, cfg.hidden_act, bias, **shard)

            self.mlp = MoE(cfg.hidden_size, moe.routing, moe.moe_intermediate_size, 0, mlp)

    def fuses(self, h: torch.Tensor) -> bool:
        """``FusedDecoderLayer.fuses``; a mixture's layer: the attention block's fused path (its output
        projection without bias), the block itself materialising its input (``moe_block_fused``)."""
        if not self.is_moe:
            return super().fuses(h)
        attn = self.self_attn
        return attn.o_proj.bias is None and fused_decoder.attention_fuses(attn, h)

    def forward_fused(self, positions: torch.Tensor, rows, next_norm: nn.Module):
        """``FusedDecoderLayer.forward_fused``; a mixture's layer runs its block as layers/fused_decoder.py
        ``moe_block_fused`` (module docstring)."""
        if not self.is_moe:
            return super().forward_fused(positions, rows, next_norm)
        attn, moe = self.self_attn, self.mlp
        out = fused_decoder.attend_fused(attn, positions, rows, self.input_layernorm.eps)
        return fused_decoder.moe_block_fused(
            out,
            attn.o_proj,
            rows.stream,
            self.post_attention_layernorm,
            next_norm,
            moe.partial,
            takes_normed_rows(moe.gate, moe.experts, moe.shared_experts, rows.stream),
            moe.group,
        )


class Qwen3MoeForCausalLM(Qwen3ForCausalLM):
    @classmethod
    def layer_windows(cls, cfg: ConfigFields, num_layers: int) -> tuple[int | None, ...]:
        # transformers Qwen3MoeConfig.__post_init__ keeps sliding_window only with use_sliding_window, and
        # Qwen3MoeAttention then slides on every layer (no max_window_layers, no layer_types)
        if not cfg.boolean("use_sliding_window", False):
            return ()
        return empty_if_all_full((cfg.optional_integer("sliding_window", 4096),) * num_layers)

    @classmethod
    def layer_factory(cls, cfg: ModelConfig) -> Callable[..., nn.Module]:
        moe = Qwen3MoeConfig.from_model_config(cfg)
        return lambda cfg, rotary, window, i: Qwen3MoeDecoderLayer(
            cfg, rotary, window, moe if i in moe.moe_layers else None
        )

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor):
        """``LlamaForCausalLM.forward`` over a stack of dense and mixture layers: the fused residual stack
        where every layer takes it (``run_stack``), else the eager one."""
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
