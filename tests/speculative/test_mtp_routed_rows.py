"""An MTP draft routes to experts only the rows whose output something reads (speculative/drafters/mtp.py
``_rows_read``, layers/routed_rows.py). In the zoo DeepSeek model's two chained mixture layers, layer 0 routes
every pending row of a window, since layer 1 reads them all; layer 1 routes each window's last row, the one its
draft reads. A prompt's rows (``absorb``) all route in layer 0 (no mask) and none in layer 1. The output stays plain
decoding's."""

from pathlib import Path

import torch

from outpace import LLM, SamplingParams
from outpace.config import SpeculativeConfig
from outpace.layers.routed_rows import routed_mask

ZOO = Path(__file__).resolve().parents[2] / "zoo"
GREEDY = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
PROMPTS = [[5, 17, 3, 40, 9], [9, 9, 101, 7, 64, 3, 12], [300, 2, 2]]


def recorded(proposer, name: str, calls: list):
    """``proposer.<name>``, each call first appending (name, None for its window, [] for the MTP layers'
    masks) to ``calls``."""
    method = getattr(proposer, name)

    def run(*args):
        calls.append((name, None, []))
        return method(*args)

    return run


def test_a_draft_routes_only_the_rows_it_reads():
    target = str(ZOO / "tinyds")
    plain = [o.token_ids for o in LLM(target).generate(PROMPTS, GREEDY)]
    llm = LLM(target, speculative=SpeculativeConfig("mtp", num_steps=2))
    proposer = llm.engine.proposer
    assert proposer.mixtures == [True, True] and proposer.chained
    calls = []  # (absorb or draft, the draft's window, [(layer, its mask)])

    def record(k: int, rows: int) -> None:
        mask = routed_mask(rows)
        calls[-1][2].append((k, None if mask is None else mask.clone()))

    for k, layer in enumerate(proposer.layers):
        layer.register_forward_pre_hook(lambda _, args, k=k: record(k, args[0].shape[0]))
    proposer.absorb = recorded(proposer, "absorb", calls)
    proposer.draft = recorded(proposer, "draft", calls)
    window = proposer.pending.window

    def windows(*args):
        calls[-1] = (calls[-1][0], window(*args), calls[-1][2])
        return calls[-1][1]

    proposer.pending.window = windows
    assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == plain

    absorbed = [masks for name, _, masks in calls if name == "absorb" and masks]
    drafts = [(w, masks) for name, w, masks in calls if name == "draft"]
    assert absorbed and len(drafts) > 3
    for [(k0, first), (k1, second)] in absorbed:  # a prompt's rows: layer 1's output feeds nothing
        assert (k0, k1) == (0, 1) and first is None and not second.any()
    for w, [(k0, first), (k1, second)] in drafts:
        assert (k0, k1) == (0, 1)
        last = torch.zeros_like(w.live)
        last[w.last] = True
        assert torch.equal(first, w.live) and torch.equal(second, last)
        assert int(second.sum()) == w.last.numel() <= int(first.sum())
    assert any(int(second.sum()) < int(first.sum()) for _, [(_, first), (_, second)] in drafts)
