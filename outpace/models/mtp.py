"""Multi-token-prediction layer, DeepSeek-V3 style.

Given the embedding of token t+1 and a hidden state for position t, an MTP layer predicts token
t+2: ``h = eh_proj(concat(enorm(embed(t+1)), hnorm(hidden_t)))`` then one decoder layer; its
pre-norm output goes through the target's shared final norm and head for logits.

Chaining (Step-3.5-Flash): layer 0 consumes the target's last pre-norm hidden state and layer k
consumes the pre-norm output of layer k-1, each predicting one token further ahead. The
non-chained form feeds every layer the target's state.
Checkpoint names: ``model.layers.{num_hidden_layers + k}.{enorm,hnorm,eh_proj,self_attn,...}``.
"""
from __future__ import annotations

import torch

from outpace.config import ModelConfig
from outpace.layers.linear import linear
from outpace.layers.norm import RMSNorm
from outpace.layers.rotary import RotaryEmbedding
from outpace.models.llama import LlamaDecoderLayer


class MTPLayer(LlamaDecoderLayer):
    def __init__(self, cfg: ModelConfig, rotary: RotaryEmbedding) -> None:
        super().__init__(cfg, rotary)
        self.enorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.hnorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.eh_proj = linear(2 * cfg.hidden_size, cfg.hidden_size)

    def forward(self, positions: torch.Tensor, token_embeds: torch.Tensor,  # type: ignore[override]
                hidden_states: torch.Tensor) -> torch.Tensor:
        """token_embeds [n, hidden] of token t+1; hidden_states [n, hidden] at t -> [n, hidden] pre-norm."""
        h = self.eh_proj(torch.cat((self.enorm(token_embeds), self.hnorm(hidden_states)), dim=-1))
        return super().forward(positions, h)
