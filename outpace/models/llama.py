"""The Llama family: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM (attention bias) and
Qwen3ForCausalLM (per-head q/k RMSNorm) share this one implementation, composed of the decoder
layers of outpace/layers/fused_decoder.py (which choose their kernels: this file is eager code only).

Forward works on flat tokens: ``input_ids [num_tokens]``, ``positions [num_tokens]``; the
attention metadata travels in the forward context. ``forward`` returns the last hidden state
*before* the final norm (what MTP layers consume); ``compute_logits`` applies norm and head to
only the rows that need logits.

Aux hidden states (for EAGLE3 drafts): capture index i means "the input of layer i"; index
``num_hidden_layers`` means the output of the last layer before the final norm.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from outpace.layers.embedding import LMHead, VocabEmbedding
from outpace.layers.fused_decoder import (
    FusedDecoderLayer,
    head_argmax_tokens,
    norm_head_logits,
    run_layers,
)
from outpace.layers.norm import RMSNorm
from outpace.layers.rotary import RotaryEmbedding
from outpace.model_config import ModelConfig
from outpace.models.config_hooks import ConfigHooks
from outpace.validation import ConfigFields


def check_aux_layer_ids(
    layer_ids: tuple[int, ...], num_layers: int, name: str = "aux hidden state layer ids"
) -> None:
    """Refuse capture ids outside 0 .. ``num_layers`` (id i: the input of layer i; ``num_layers``: the last
    layer's output), ``name`` saying where they came from."""
    bad = [i for i in layer_ids if not 0 <= i <= num_layers]
    if bad:
        raise ValueError(
            f"{name} {list(layer_ids)}: ids {bad} are not in the target's 0 .. {num_layers} (the input "
            f"of layer i; {num_layers}: the last layer's output)"
        )


@dataclass
class ModelOutput:
    hidden_states: torch.Tensor  # [num_tokens, hidden] last layer's output, pre-norm
    aux_hidden_states: torch.Tensor | None = (
        None  # [num_tokens, num_aux * hidden] captured layer inputs
    )


def build_rotary(cfg: ModelConfig) -> RotaryEmbedding:
    return RotaryEmbedding(
        cfg.head_dim,
        cfg.max_position_embeddings,
        cfg.rope_theta,
        cfg.rope_scaling,
        query_scaling=cfg.query_scaling,
    )


class LlamaModel(nn.Module):
    def __init__(
        self, cfg: ModelConfig, make_layer: Callable[..., nn.Module] | None = None
    ) -> None:
        """``make_layer(cfg, rotary, sliding_window, index)``: decoder layer ``index`` (default: a
        ``FusedDecoderLayer``; a family whose layers differ, models/qwen3_moe.py, gives its own)."""
        super().__init__()
        self.rotary = build_rotary(cfg)
        self.embed_tokens = VocabEmbedding(cfg.vocab_size, cfg.hidden_size)
        make_layer = make_layer or (
            lambda cfg, rotary, window, _: FusedDecoderLayer(cfg, rotary, window)
        )
        self.layers = nn.ModuleList(
            make_layer(cfg, self.rotary, cfg.layer_window(i), i)
            for i in range(cfg.num_hidden_layers)
        )
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class LlamaForCausalLM(nn.Module, ConfigHooks):
    # Checkpoint tensors that are legitimately not parameters here.
    ignored_checkpoint_tensors = (r"\.rotary_emb\.inv_freq$",)
    # Every layer shards over tensor-parallel ranks (layers/decoder.py, layers/embedding.py) when built
    # inside distributed.group.building_in: models/loader.py refuses classes without this flag.
    shards_over_ranks = True
    class_defaults = {"max_position_embeddings": 2048}  # LlamaConfig's

    @classmethod
    def config_overrides(cls, cfg: ConfigFields) -> dict:
        # transformers LlamaAttention: attention_bias on q/k/v/o; LlamaMLP: mlp_bias on gate/up/down
        bias = cfg.boolean("attention_bias", False)
        mlp_bias = cfg.boolean("mlp_bias", False)
        return {"attention_bias": bias, "attention_out_bias": bias, "mlp_bias": mlp_bias}

    def __init__(self, cfg: ModelConfig, mtp_own_heads: bool = False) -> None:
        """``mtp_own_heads``: the MTP layers carry their own embedding and shared head (DeepSeek-V3
        layout; the loader decides from the checkpoint's tensor names, models/drafts/mtp.py)."""
        super().__init__()
        self.config = cfg
        self.model = LlamaModel(cfg, self.layer_factory(cfg))
        self.lm_head = LMHead(
            cfg.hidden_size,
            cfg.vocab_size,
            tied_to=self.model.embed_tokens if cfg.tie_word_embeddings else None,
        )
        self.aux_layer_ids: tuple[int, ...] = ()
        if cfg.num_nextn_predict_layers:
            from outpace.models.drafts.mtp import build_mtp_layers

            self.mtp_layers = build_mtp_layers(cfg, self.model.rotary, mtp_own_heads)

    @classmethod
    def layer_factory(cls, cfg: ModelConfig) -> Callable[..., nn.Module] | None:
        """``LlamaModel``'s ``make_layer`` (None: every layer a ``FusedDecoderLayer``)."""
        return None

    def set_aux_hidden_state_layers(self, layer_ids: tuple[int, ...]) -> None:
        """Capture the inputs of these layers (index num_hidden_layers: the last layer's output)."""
        check_aux_layer_ids(layer_ids, self.config.num_hidden_layers)
        self.aux_layer_ids = tuple(layer_ids)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_tokens(input_ids)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> ModelOutput:
        h, captured = run_layers(
            self.model.layers, self.model.norm, positions, self.embed(input_ids), self.aux_layer_ids
        )
        return self._model_output(h, captured)

    def _model_output(self, h: torch.Tensor, captured: dict[int, torch.Tensor]) -> ModelOutput:
        """h [num_tokens, hidden], the last layer's output; captured: layer index -> its input stream."""
        captured[len(self.model.layers)] = h
        aux = [captured[i] for i in self.aux_layer_ids]  # in the drafter's order, repeats allowed
        return ModelOutput(h, torch.cat(aux, dim=-1) if aux else None)

    def compute_logits(
        self, hidden_states: torch.Tensor, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """[n, hidden] pre-norm hidden states -> [n, vocab] float32 logits (written into ``out`` if given)."""
        return norm_head_logits(self.model.norm, self.lm_head, hidden_states, out)

    def greedy_tokens(
        self, hidden_states: torch.Tensor, rows: torch.Tensor | None = None
    ) -> torch.Tensor:
        """[n, hidden] pre-norm -> [R] int64 the argmax of ``compute_logits`` of rows ``rows`` [R] (all when
        None), in one launch for few rows on the GPU (layers/fused_decoder.py ``head_argmax_tokens``): a greedy
        verify's tokens (engine/decode_step.py)."""
        return head_argmax_tokens(self.lm_head, hidden_states, self.model.norm, rows)

    # Checkpoint names: MTP layers are stored DeepSeek-V3 style after the decoder layers.
    def checkpoint_name(self, param_name: str) -> str:
        m = re.match(r"mtp_layers\.(\d+)\.(.*)", param_name)
        if m:
            return f"model.layers.{self.config.num_hidden_layers + int(m.group(1))}.{m.group(2)}"
        return param_name
