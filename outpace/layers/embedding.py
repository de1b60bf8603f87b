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


class ScaledVocabEmbedding(VocabEmbedding):
    """[num_tokens] token ids -> [num_tokens, dim] rows times ``scale``, the scale rounded to the weight's
    dtype first (transformers Gemma3TextScaledWordEmbedding: sqrt(hidden) is 55.5, not 55.4256, in bf16)."""

    def __init__(self, num_embeddings: int, embedding_dim: int, scale: float) -> None:
        super().__init__(num_embeddings, embedding_dim)
        self.scale = scale

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return super().forward(input_ids) * torch.tensor(self.scale, dtype=self.weight.dtype)


def softcap(logits: torch.Tensor, cap: float) -> torch.Tensor:
    """cap * tanh(logits / cap), element-wise: logits squashed into (-cap, cap) (Gemma's final logit
    softcapping, transformers Gemma3ForCausalLM.forward)."""
    return torch.tanh(logits / cap) * cap
