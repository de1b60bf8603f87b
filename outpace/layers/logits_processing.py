"""What happens to the target's logits before they are sampled or verified, and the log-probabilities
reported for the tokens committed.

Order (vLLM v1's sampler): ``logit_bias`` is added, then the penalties, then ``min_tokens``' ban of the stop
ids, then the grammar's mask; the result is what temperature and the truncation filters (layers/sampler.py)
then process. Every function here works on a block of verified positions at once, ``[b, n, V]`` (n = 1 for a
single position), with no host sync, so a decode step can apply them at every verified node.

Penalties as vLLM defines them (vllm/model_executor/layers/utils.py ``apply_penalties``):
- ``repetition_penalty`` r: a token seen in the prompt or the output has its logit divided by r when
  positive, multiplied by r otherwise;
- ``frequency_penalty`` f: ``f * count`` is subtracted, count = the token's occurrences in the output;
- ``presence_penalty`` p: ``p`` is subtracted once from every token present in the output.
At a verified node the output is the committed output plus the drafts on the node's path, as if that
draft prefix had been committed (``node_counts``). ``min_tokens`` (vLLM's ``MinTokensLogitsProcessor``): a
request's stop ids (its ``stop_token_ids`` and the model's end-of-sequence ids) get -inf at the positions of its
first ``min_tokens`` output tokens, a verified node's position being that of the token it decides.

Log-probabilities are the target's *raw* ones: log-softmax of the logits before any of the above
(vLLM's default ``logprobs_mode="raw_logprobs"``), so they do not depend on the request's sampling
settings, and a verified position reports what a plain decode step at that position would.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

BITS_PER_WORD = 32  # a grammar bitmask packs 32 tokens per int32 word: bit i of word w allows token 32 * w + i (xgrammar's layout)

# the largest logit a repetition penalty leaves: 1e30 / GREEDY_EPS (layers/sampler.py) is finite in float32
PENALISED_LOGIT_MAX = 1e30
# NOTE: the largest repetition penalty the request table holds (SamplingParams takes any finite one > 0, as vLLM):
# a larger one would round to +inf in float32 and a seen logit of 0 would become 0 * inf = NaN. Clamped on the
# host, it penalises as the true value would up to float32's range: 0 stays 0, positives fall towards 0, negatives
# towards (or to) -inf.
REPETITION_PENALTY_MAX = torch.finfo(torch.float32).max


def bitmask_words(vocab_size: int) -> int:
    """int32 words of a token bitmask over ``vocab_size`` tokens."""
    return (vocab_size + BITS_PER_WORD - 1) // BITS_PER_WORD


def allowed_tokens(bitmask: Tensor, vocab_size: int) -> Tensor:
    """Unpack a token bitmask ``[..., words]`` int32 into ``[..., vocab_size]`` bool (True: allowed)."""
    shifts = torch.arange(BITS_PER_WORD, device=bitmask.device, dtype=torch.int32)  # [32]
    bits = (bitmask[..., None] >> shifts) & 1  # [..., words, 32]
    return bits.flatten(-2)[..., :vocab_size].bool()  # [..., V]


def apply_token_bitmask(logits: Tensor, bitmask: Tensor) -> Tensor:
    """-inf at the tokens a grammar forbids. ``logits`` [..., V], ``bitmask`` [..., words] -> [..., V]."""
    return logits.masked_fill(~allowed_tokens(bitmask, logits.shape[-1]), float("-inf"))


@dataclass
class Penalties:
    """Per-request penalty settings and what they read; one row per request.

    repetition  # [b] float32, 1 = off
    frequency   # [b] float32, 0 = off
    presence    # [b] float32, 0 = off
    logit_bias  # [b, V] float32, added as it is
    prompt_mask # [b, V] bool: the token occurs in the prompt
    counts      # [b, V] int32: the token's occurrences among the output tokens before the first position
    min_end     # [b] int64: the prompt's length plus min_tokens; at positions before it the stop ids are banned
    stop_mask   # [b, V] bool: the stop ids min_tokens bans
    """

    repetition: Tensor
    frequency: Tensor
    presence: Tensor
    logit_bias: Tensor
    prompt_mask: Tensor
    counts: Tensor
    min_end: Tensor
    stop_mask: Tensor

    def apply(
        self,
        logits: Tensor,
        positions: Tensor,
        node_tokens: Tensor | None = None,
        ancestors: Tensor | None = None,
    ) -> Tensor:
        """Biased and penalized ``logits`` [b, n, V] -> float32 [b, n, V], ``positions`` [b, n] the position of
        the token each decides. With ``node_tokens`` [b, n] and ``ancestors`` [b, n, n] (node u's path: itself and
        its ancestors, node 0 included) node u counts the tokens on its path as output too (``node_counts``);
        without them every position reads ``counts``."""
        b, n, _ = logits.shape
        counts = (
            self.counts[:, None, :].float()
            if node_tokens is None
            else node_counts(self.counts, node_tokens, ancestors)
        )  # [b, n|1, V]
        logits = logits.float() + self.logit_bias[:, None, :]  # [b, n, V]
        seen = self.prompt_mask[:, None, :] | (counts > 0)  # [b, n, V]
        rep = self.repetition[:, None, None]  # [b, 1, 1]
        # a tiny penalty's quotient kept finite, also once divided by any sampled temperature (>= GREEDY_EPS): +inf
        # logits would make the softmax NaN
        raised = (logits / rep).clamp_(max=PENALISED_LOGIT_MAX)  # [b, n, V]
        logits = torch.where(seen, torch.where(logits > 0, raised, logits * rep), logits)
        logits = logits - self.frequency[:, None, None] * counts
        logits = logits - self.presence[:, None, None] * (counts > 0).float()
        banned = (positions < self.min_end[:, None])[:, :, None] & self.stop_mask[:, None, :]
        return logits.masked_fill(banned, float("-inf"))


def node_counts(counts: Tensor, node_tokens: Tensor, ancestors: Tensor) -> Tensor:
    """Output-token counts at every node of a draft tree, as if its path had been committed.

    ``counts`` [b, V] (the committed output before node 0), ``node_tokens`` [b, n] (node 0: the last
    committed token), ``ancestors`` [b, n, n] bool (``ancestors[s, u, w]``: w is u or an ancestor of u).
    -> [b, n, V] float32: counts + one for each token on the path root .. u."""
    b, n = node_tokens.shape
    out = counts[:, None, :].float().expand(b, n, counts.shape[-1]).clone()  # [b, n, V]
    return out.scatter_add_(2, node_tokens[:, None, :].expand(b, n, n), ancestors.float())


def count_tokens(counts: Tensor, slots: Tensor, tokens: Tensor, weights: Tensor) -> None:
    """counts[slots[s], tokens[s, j]] += weights[s, j] (in place; repeated tokens add up).
    ``counts`` [slots, V] int32, ``slots`` [b], ``tokens`` [b, w] int64, ``weights`` [b, w] (0 or 1)."""
    index = slots[:, None].expand_as(tokens)
    counts.index_put_(
        (index.reshape(-1), tokens.reshape(-1)),
        weights.reshape(-1).to(counts.dtype),
        accumulate=True,
    )


@dataclass
class TokenLogprobs:
    """Raw log-probabilities at some positions (one row each): the chosen token's, its rank (1 = most
    likely; 1 + the number of tokens strictly more likely), and the ``k`` most likely tokens'.

    logprob      # [m] float32
    rank         # [m] int64
    top_ids      # [m, k] int64
    top_logprobs # [m, k] float32
    """

    logprob: Tensor
    rank: Tensor
    top_ids: Tensor
    top_logprobs: Tensor

    def pack(self) -> Tensor:
        """[m * (2 + 2k)] int64: per row logprob (float32 bits), rank, top ids, top logprobs (bits)."""
        bits = lambda t: t.float().contiguous().view(torch.int32).to(torch.int64)  # noqa: E731
        return torch.cat(
            [
                bits(self.logprob)[:, None],
                self.rank[:, None],
                self.top_ids,
                bits(self.top_logprobs),
            ],
            dim=1,
        ).reshape(-1)

    def host_rows(self) -> list[tuple[float, int, list[int], list[float]]]:
        """(logprob, rank, top ids, top logprobs) per row, on the host."""
        return list(
            zip(
                self.logprob.tolist(),
                self.rank.tolist(),
                self.top_ids.tolist(),
                self.top_logprobs.tolist(),
            )
        )

    @staticmethod
    def unpack_rows(values: list[int], k: int) -> list[tuple[float, int, list[int], list[float]]]:
        """The host side of ``pack``: (logprob, rank, top ids, top logprobs) per row."""
        width = 2 + 2 * k
        as_float = (
            torch.tensor(values, dtype=torch.int64).to(torch.int32).view(torch.float32).tolist()
        )
        rows = []
        for r in range(len(values) // width):
            at = r * width
            rows.append(
                (
                    as_float[at],
                    values[at + 1],
                    values[at + 2 : at + 2 + k],
                    as_float[at + 2 + k : at + width],
                )
            )
        return rows


def token_logprobs(logits: Tensor, tokens: Tensor, k: int) -> TokenLogprobs:
    """Raw log-probabilities of ``tokens`` [m] under ``logits`` [m, V], with the top ``k``."""
    logp = torch.log_softmax(logits.float(), dim=-1)  # [m, V]
    chosen = logp.gather(1, tokens[:, None])  # [m, 1]
    rank = (logp > chosen).sum(dim=1) + 1  # [m]
    top = logp.topk(k, dim=-1)  # [m, k]
    return TokenLogprobs(chosen.squeeze(1), rank, top.indices, top.values)
