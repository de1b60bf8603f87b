"""A repetition_penalty beyond float32's range (vLLM takes any value > 0): it rounded to +inf in the request table,
and a seen token's logit of exactly 0 became 0 * inf = NaN. A penalised 0 stays 0 (vLLM's and transformers'
0 / r = 0 * r = 0), and every other penalised logit keeps its order."""

import math

import torch

from outpace import SamplingParams
from outpace.cache.block_pool import BlockPool
from outpace.engine.request_table import RequestTable
from outpace.request import Request

VOCAB = 8


def penalised(repetition_penalty: float, logits: list[float]) -> torch.Tensor:
    """``logits`` [V] after the penalty of a request whose prompt holds every token, through the request table's
    parameter preparation and ``Penalties.apply``."""
    table = RequestTable(BlockPool(4, 4), max_seqs=2, max_blocks=2, device="cpu", vocab_size=VOCAB)
    params = SamplingParams(repetition_penalty=repetition_penalty)
    req = Request("r", list(range(VOCAB)), params)
    (row,) = table.assign([req])
    table.load_history(req, req.num_prompt_tokens)
    rows = torch.tensor([row])
    position = torch.tensor([[req.num_prompt_tokens]])
    return table.penalties(rows).apply(torch.tensor([[logits]]), position)[0, 0]  # [V]


def test_a_penalty_past_float32s_range_keeps_a_zero_logit_zero():
    logits = [0.0, 3.0, -2.0, 0.5, -0.25, 100.0, -100.0, 0.0]
    for penalty in (1e39, 1e300, math.nextafter(float(torch.finfo(torch.float32).max), math.inf)):
        got = penalised(penalty, logits)
        assert not got.isnan().any(), (penalty, got)
        assert got[0] == 0 and got[7] == 0, (penalty, got)
        assert (got[[1, 3, 5]] > 0).all()  # positive logits divided: still positive, the order kept
        assert got[5] >= got[1] >= got[3]
        assert (got[[2, 4, 6]] < 0).all()  # negative ones multiplied: still below 0


def test_a_penalty_float32_holds_is_unchanged():
    logits = [0.0, 3.0, -2.0, 0.5, -0.25, 100.0, -100.0, 0.0]
    want = torch.tensor([x / 1e38 if x > 0 else x * 1e38 for x in logits], dtype=torch.float32)
    torch.testing.assert_close(penalised(1e38, logits), want)
