"""The n-gram drafter's absorb (speculative/drafters/ngram.py): each prefill chunk's tokens land in its request's
history row at their positions and the token after each at the next, the prefix cache's tokens before a first chunk,
whatever the chunks' order, starts and lengths."""

from types import SimpleNamespace

import torch

from outpace.config import SpeculativeConfig
from outpace.speculative.drafters.ngram import NgramProposer
from outpace.speculative.proposer import PrefillRows


def test_absorb_writes_every_chunk_at_its_rows_positions():
    target = SimpleNamespace(config=SimpleNamespace(max_position_embeddings=40))
    proposer = NgramProposer(
        SpeculativeConfig("ngram", num_steps=3), target, None, 4, torch.float32, "cpu"
    )
    proposer.history.fill_(-1)
    # (history row, first position, tokens, tokens the prefix cache gave before it)
    chunks = [
        (2, 0, 5, []),
        (0, 7, 3, list(range(100, 107))),
        (3, 4, 2, []),
        (1, 3, 4, [55, 56, 57]),
    ]
    counts = [c for _, _, c, _ in chunks]
    g = torch.Generator().manual_seed(0)
    # each chunk's tokens and the one after its last (the prompt's next, or the one sampled)
    texts = [torch.randint(1000, (c + 1,), generator=g) for c in counts]
    token_ids = torch.cat([t[:-1] for t in texts])
    next_ids = torch.cat([t[1:] for t in texts])
    prefill = PrefillRows(
        req_indices=[row for row, _, _, _ in chunks],
        starts=[start for _, start, _, _ in chunks],
        counts=counts,
        final=[True, True, False, True],
        rows=torch.arange(sum(counts)),
        token_ids=token_ids,
        next_token_ids=next_ids,
        ahead_token_ids=torch.zeros(len(chunks), 0, dtype=torch.int64),
        hidden_states=torch.zeros(sum(counts), 8),
        aux_hidden_states=None,
        tables=[[] for _ in chunks],
        reused_token_ids=[reused for _, _, _, reused in chunks],
        num_tokens=[start + c for _, start, c, _ in chunks],
    )
    proposer.absorb(prefill)

    want = torch.full_like(proposer.history, -1)
    at = 0
    for row, start, count, reused in chunks:
        want[row, : len(reused)] = torch.tensor(reused, dtype=torch.int64)
        for j in range(count):
            want[row, start + j] = token_ids[at + j]
            want[row, start + j + 1] = next_ids[at + j]
        at += count
    assert torch.equal(proposer.history, want)
