"""Token embedding and the language-model head (optionally tied to the embedding), vocab-parallel over
the tensor-parallel group the model is built in (outpace/distributed/group.py).

With several ranks each holds ``vocab_shard_rows`` rows of the (padded) vocabulary, rank r the ids
r * rows .. (r + 1) * rows - 1 (distributed/sharding.py): the embedding looks up the ids it holds,
zeroes the others and sums the rows over the ranks (vLLM's VocabParallelEmbedding masks and
all-reduces the same way); the head computes its rows' logits and gathers every rank's, trimmed to
the real vocabulary. With one rank both are the plain layers, shaped as the checkpoint.

A model may keep its table whole on every rank instead (``replicated=True``: Gemma, as SGLang's Gemma keeps
a plain nn.Embedding), and a head tied to it is then whole too. A vocab-parallel draft that borrows such
a table (EAGLE3) is handed this rank's rows of it, ceil-divided and padded as its own would be, and a
borrowed tied head is rebound to those rows (``vocab_shard_of``; SGLang's Gemma _shard_weight).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from outpace.distributed.collectives import all_gather_last_dim, all_reduce
from outpace.distributed.group import SINGLE, RankGroup, build_group
from outpace.distributed.sharding import Shard, mark_shard, vocab_shard_rows
from outpace.layers.linear import project


class VocabEmbedding(nn.Embedding):
    """[num_tokens] token ids -> [num_tokens, hidden]. ``weight`` [rows, hidden]: this rank's rows."""

    def __init__(self, num_embeddings: int, embedding_dim: int, replicated: bool = False) -> None:
        group = SINGLE if replicated else build_group()
        rows = vocab_shard_rows(num_embeddings, group.size)
        super().__init__(rows, embedding_dim)
        self.group: RankGroup = group
        self.vocab_size = num_embeddings
        self.first_id = group.rank * rows  # the first token id this rank holds
        if group.size > 1:
            mark_shard(self.weight, Shard(0, self.first_id, rows, num_embeddings))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.group.size == 1:
            return super().forward(input_ids)
        local = input_ids - self.first_id
        elsewhere = (local < 0) | (local >= self.num_embeddings)  # [num_tokens]
        rows = F.embedding(local.masked_fill(elsewhere, 0), self.weight)  # [num_tokens, hidden]
        return all_reduce(rows.masked_fill(elsewhere[:, None], 0.0), self.group)


class LMHead(nn.Module):
    """[num_tokens, hidden] -> [num_tokens, vocab] logits; shares the embedding's weight when tied.
    ``weight`` [rows, hidden]: this rank's rows of the vocabulary."""

    def __init__(
        self, hidden_size: int, vocab_size: int, tied_to: VocabEmbedding | None = None
    ) -> None:
        super().__init__()
        group = (
            tied_to.group if tied_to is not None else build_group()
        )  # a tied head splits as its table
        self.group: RankGroup = group
        self.vocab_size = vocab_size
        if tied_to is not None:
            self.weight = tied_to.weight
        else:
            rows = vocab_shard_rows(vocab_size, group.size)
            self.weight = nn.Parameter(torch.empty(rows, hidden_size))
            if group.size > 1:
                mark_shard(self.weight, Shard(0, group.rank * rows, rows, vocab_size))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = project(hidden, self.weight)  # [num_tokens, rows]
        if self.group.size == 1:
            return logits
        return all_gather_last_dim(logits, self.group)[..., : self.vocab_size]

    def full_weight(self) -> torch.Tensor:
        """[vocab, hidden]: every rank's rows, gathered (a collective when sharded)."""
        if self.group.size == 1:
            return self.weight
        return all_gather_last_dim(self.weight.detach().t(), self.group)[:, : self.vocab_size].t()


class ScaledVocabEmbedding(VocabEmbedding):
    """[num_tokens] token ids -> [num_tokens, dim] rows times ``scale``, the scale rounded to the weight's
    dtype first (transformers Gemma3TextScaledWordEmbedding: sqrt(hidden) is 55.5, not 55.4256, in bf16)."""

    def __init__(
        self, num_embeddings: int, embedding_dim: int, scale: float, replicated: bool = False
    ) -> None:
        super().__init__(num_embeddings, embedding_dim, replicated)
        self.scale = scale

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return super().forward(input_ids) * torch.tensor(self.scale, dtype=self.weight.dtype)


def softcap(logits: torch.Tensor, cap: float) -> torch.Tensor:
    """cap * tanh(logits / cap), element-wise: logits squashed into (-cap, cap) (Gemma's final logit
    softcapping, transformers Gemma3ForCausalLM.forward)."""
    return torch.tanh(logits / cap) * cap


def vocab_shard_of(table: VocabEmbedding) -> VocabEmbedding:
    """The embedding a vocab-parallel module built in the current group reads: ``table`` itself when it is
    already split over that group (or there is one rank), else, for a table kept whole on every rank, a
    ``VocabEmbedding`` of this rank's rows of it: views of the table's rows, the last rank's padding rows
    past the vocabulary zeros (a copy of its rows then)."""
    group = build_group()
    if group.size == 1 or table.group.size == group.size:
        return table
    if table.group.size != 1:
        raise ValueError(
            f"an embedding split over {table.group.size} ranks cannot be handed to a module built over "
            f"{group.size}"
        )
    with torch.device("meta"):
        shard = VocabEmbedding(table.vocab_size, table.embedding_dim)  # [rows, dim] in ``group``
    first, rows, full = shard.first_id, shard.num_embeddings, table.weight.detach()
    mine = full[first : first + rows]  # [<= rows, dim] views
    if mine.shape[0] < rows:
        mine = torch.cat([mine, mine.new_zeros(rows - mine.shape[0], mine.shape[1])])
    shard.weight = nn.Parameter(mine, requires_grad=False)
    return shard
