"""A hot vocabulary for drafts read from a head of the target's vocabulary (``--speculative-token-map``): the
draft's logits over a chosen subset of the vocabulary only.

MTP layers and DFlash drafts predict through a head of the target's size: Qwen3-Next's 151,936 rows of 2,048 (622 MB
in bf16), Qwen3-8B's of 4,096 (1.24 GB), DeepSeek-V3's 129,280 of 7,168 (1.85 GB), read once a draft step (an MTP
layer's step, or a DFlash block), beside the verify step's own read of the target's head. A draft needs only the
tokens it is likely to propose, so a token map names those rows (FR-Spec: frequency-ranked speculative sampling, the
most frequent tokens of a corpus; 32,768 of them cut the read by 4.6x on Qwen's vocabulary) and the draft reads them
alone (``HotHead``: a copy of those rows; ``Readout``: the draft's tokens and logits through it). Lossless all the
same: greedy, a draft outside the map is just never proposed; sampled, the draft's distribution q is zero outside
the map, and verification accepts against that q (speculative/chain.py ``choose_chain`` gets logits of -inf
there). The map changes which drafts are proposed, never what is committed; what it costs in acceptance depends on
the text (benchmarks/results/token_map_zoo/).

The file is what SGLang's ``--speculative-token-map`` reads (speculative/spec_utils.py ``load_token_map``:
``torch.load(path, weights_only=True)``, then a tensor of the ids): a list or 1-D tensor of token ids saved by
``torch.save``, such as FR-Spec's published ``freq_32768.pt``; ``outpace token-map`` makes one from text. SGLang
applies it to drafts that share the target's head (EAGLE, MTP) and ignores it for EAGLE3, whose drafts have their
own vocabulary (``d2t``); here a drafter that reads no head of the target's vocabulary refuses it
(``Proposer.takes_token_map``). A path, not a hub name: nothing is downloaded.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path

import torch
from torch import nn

from outpace.layers.fused_decoder import head_argmax_tokens, head_logits
from outpace.layers.linear import is_sharded, project
from outpace.validation import ConfigError

FLAG = "--speculative-token-map"
logger = logging.getLogger(__name__)


def load_token_map(path: str | Path, vocab_size: int) -> torch.Tensor:
    """The token map at ``path`` -> [H] int64 token ids (in the file's order), each in [0, vocab_size), none
    twice. Refused, naming the flag and the file, when it is no such map."""
    path = Path(path)
    where = f"{FLAG} {path}"
    if not path.is_file():
        raise ConfigError(f"{where}: no such file")
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # (torch raises several kinds for a file it cannot read)
        raise ConfigError(
            f"{where}: not a token map saved by torch.save ({type(e).__name__}: {e})"
        ) from e
    try:
        ids = torch.as_tensor(saved)
    except (TypeError, ValueError, RuntimeError) as e:
        raise ConfigError(
            f"{where}: holds a {type(saved).__name__}, not a list or tensor of token ids"
        ) from e
    if ids.dim() != 1 or ids.numel() == 0 or ids.dtype.is_floating_point or ids.dtype == torch.bool:
        raise ConfigError(
            f"{where}: holds a {ids.dtype} tensor of shape {tuple(ids.shape)}; a token map is a non-empty "
            "1-D list of integer token ids"
        )
    ids = ids.to(torch.int64)
    outside = ids[(ids < 0) | (ids >= vocab_size)]
    if outside.numel():
        raise ConfigError(
            f"{where}: token id {int(outside[0])} is outside the target's vocabulary of {vocab_size} "
            f"({outside.numel()} such ids): a map made for another tokenizer?"
        )
    if torch.unique(ids).numel() != ids.numel():
        raise ConfigError(f"{where}: names some token ids more than once")
    return ids


def token_counts(tokenizer, texts: Iterable[str], vocab_size: int) -> torch.Tensor:
    """[vocab_size] int64: each token's count in the texts, each tokenized whole (cut at its line breaks, a code
    tokenizer's newline-and-indent tokens would go uncounted)."""
    counts = torch.zeros(vocab_size, dtype=torch.int64)
    for text in texts:
        ids = torch.tensor(
            tokenizer(text, add_special_tokens=False)["input_ids"], dtype=torch.int64
        )
        counts += torch.bincount(ids, minlength=vocab_size)[:vocab_size]
    return counts


def most_frequent(counts: torch.Tensor, size: int) -> torch.Tensor:
    """The ``size`` token ids of the highest counts (counts [vocab]), the most frequent first, equal counts in id
    order: FR-Spec's frequency-ranked vocabulary (``outpace token-map`` counts a text's tokens)."""
    return torch.sort(counts, descending=True, stable=True).indices[:size]


class HotHead(nn.Module):
    """The rows ``ids`` [H] of a head [vocab, hidden], copied: a head of H columns. A head split across
    tensor-parallel ranks (layers/embedding.py ``LMHead``, by vocabulary rows) is gathered first, a collective
    that every rank makes as it builds its drafter: each rank then holds the map's rows whole and reads them from
    its copy of the (replicated) hidden rows, so no rank waits on another for a draft's logits."""

    def __init__(self, head: nn.Module, ids: torch.Tensor) -> None:
        super().__init__()
        weight = head.full_weight() if is_sharded(head) else getattr(head, "weight", None)
        if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
            raise ConfigError(
                f"{FLAG}: the draft's head ({type(head).__name__}) holds no [vocab, hidden] weight to take "
                "the map's rows of (a quantized head?)"
            )
        self.vocab_size = weight.shape[0]
        self.register_buffer("ids", ids.to(weight.device), persistent=False)
        self.register_buffer(
            "weight", weight.detach()[self.ids].contiguous(), persistent=False
        )  # [H, hidden]

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """[n, hidden] -> [n, H] logits over the map's tokens."""
        return project(hidden, self.weight)


class Readout:
    """A draft's tokens and logits from its hidden rows: ``norm`` (None where they come normed) then ``head``, or,
    where ``hot`` is given, the head's rows of a token map, the tokens and logits still in the target's vocabulary."""

    def __init__(self, norm: nn.Module | None, head: nn.Module, hot: HotHead | None = None) -> None:
        self.norm, self.head, self.hot = norm, head, hot

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[n, hidden] -> [n, vocab] float32 (through a map: -inf outside it)."""
        if self.hot is None:
            return head_logits(self.norm, self.head, hidden)
        hot = head_logits(self.norm, self.hot, hidden)  # [n, H]
        full = hot.new_full((hot.shape[0], self.hot.vocab_size), float("-inf"))
        return full.index_copy_(1, self.hot.ids, hot)

    def greedy_tokens(self, hidden: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
        """[n, hidden] -> [R] int64 target ids: the argmax of ``logits`` for rows ``rows`` (all when None), in one
        launch for few rows on the GPU (layers/fused_decoder.py ``head_argmax_tokens``)."""
        if self.hot is None:
            return head_argmax_tokens(self.head, hidden, self.norm, rows)
        return head_argmax_tokens(self.hot, hidden, self.norm, rows, token_map=self.hot.ids)


def readouts(
    parts: list[tuple[nn.Module | None, nn.Module]], token_map: str | None, vocab_size: int
) -> list[Readout]:
    """A ``Readout`` for each (norm, head) of a drafter's heads; with a token map (``SpeculativeConfig.token_map``)
    through each head's rows of the map's tokens, heads given twice sharing their copy."""
    if token_map is None:
        return [Readout(norm, head) for norm, head in parts]
    ids = load_token_map(token_map, vocab_size)
    copies: dict[int, HotHead] = {}
    for _, head in parts:
        if id(head) not in copies:
            copies[id(head)] = HotHead(head, ids)
    copied = sum(h.weight.numel() * h.weight.element_size() for h in copies.values())
    logger.info(
        "drafts read %d of %d head rows (%s: %d head copies, %.1f MB)",
        ids.numel(),
        vocab_size,
        FLAG,
        len(copies),
        copied / 1e6,
    )
    return [Readout(norm, head, copies[id(head)]) for norm, head in parts]
