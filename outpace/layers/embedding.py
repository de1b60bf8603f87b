"""Token embedding and the language-model head (optionally tied to the embedding)."""
from __future__ import annotations

import torch
from torch import nn

from outpace.layers.linear import project


class VocabEmbedding(nn.Embedding):
    """[num_tokens] token ids -> [num_tokens, hidden]."""


class LMHead(nn.Module):
    """[num_tokens, hidden] -> [num_tokens, vocab] logits; shares the embedding's weight when tied."""

    def __init__(self, hidden_size: int, vocab_size: int, tied_to: VocabEmbedding | None = None) -> None:
        super().__init__()
        if tied_to is not None:
            self.weight = tied_to.weight
        else:
            self.weight = nn.Parameter(torch.empty(vocab_size, hidden_size))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return project(hidden, self.weight)
