"""layers/fused_projection.py ``head_argmax``: a greedy draft's tokens from its head in one launch are the argmax
of the logits ``norm_project`` writes (the first column of the maximum, across sub-tiles and programs), of the
rows asked for, through a token map; the arrival counters are left zero (in Triton's interpreter on
a CPU, on the GPU where there is one)."""

import dataclasses

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from outpace.layers.fused_projection import (
    _launch_grid,
    head_argmax,
    norm_project,
    project_rows,
)  # noqa: E402
from outpace.layers.fused_rows_kernel import PLAIN  # noqa: E402
from outpace.layers.normed_rows import normed_rows  # noqa: E402
from outpace.layers.zeroed_scratch import _BUFFERS  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPE = torch.bfloat16 if DEVICE == "cuda" else torch.float32
EPS = 1e-6


def _rand(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(DEVICE, DTYPE)


@pytest.mark.parametrize("m,k,n", [(1, 96, 700), (5, 40, 333), (16, 64, 1030), (20, 32, 200)])
def test_tokens_are_the_argmax_of_the_projection(m, k, n):
    """Across several programs (and two row tiles at 20 rows): the argmax of what ``project_rows`` writes."""
    x, w = _rand(m, k, seed=1), _rand(n, k, seed=2)
    assert _launch_grid(n, PLAIN.value, n, torch.device(DEVICE)).programs > 1
    logits = project_rows(x, w).float()
    assert torch.equal(head_argmax(x, w), logits.argmax(-1))


def test_normed_rows_gathered_and_mapped():
    """RMSNorm(x[rows]) @ W.T, its argmax looked up in a map: the draft path of EAGLE3 / MTP heads."""
    x, nw, w = _rand(9, 48, seed=3) * 3, _rand(48, seed=4), _rand(500, 48, seed=5)
    rows = torch.tensor([8, 0, 3, 3], device=DEVICE)
    token_map = torch.randperm(500, generator=torch.Generator().manual_seed(6)).to(DEVICE) + 7
    ready = normed_rows(x, nw)
    logits = norm_project(ready, EPS, w, out_dtype=torch.float32)
    want = token_map[logits[rows].argmax(-1)]
    got = head_argmax(ready, w, EPS, rows=rows, token_map=token_map)
    assert got.dtype == torch.int64
    assert torch.equal(got, want)
    assert torch.equal(head_argmax(x, w, rows=rows), F.linear(x, w)[rows].float().argmax(-1))


def test_ties_take_the_first_column_across_programs_and_sub_tiles():
    n, k = 640, 32  # on the CPU's 4 "SMs": 4 programs of 160 columns, each two sub-tiles of 80
    x = _rand(1, k, seed=7).expand(3, k).contiguous()
    w = _rand(n, k, seed=8) * 0.01
    for col in (
        639,
        300,
        100,
        17,
    ):  # the largest logit in four columns: another program's, a later sub-tile's
        w[col] = 10 * x[0]
    assert torch.equal(head_argmax(x, w), torch.full((3,), 17, device=DEVICE))
    w[:] = 0.0  # every logit equal: column 0, as argmax's
    assert torch.equal(head_argmax(x, w), torch.zeros(3, dtype=torch.int64, device=DEVICE))


def test_launches_leave_their_counters_zero():
    x, w = _rand(4, 32, seed=10), _rand(300, 32, seed=11)
    first = head_argmax(x, w)
    counters = [b for (owner, *_), b in _BUFFERS.items() if "head argmax" in owner]
    assert counters and all(int(b.abs().sum()) == 0 for b in counters)
    assert torch.equal(head_argmax(x, w), first)
    assert head_argmax(x, w, rows=torch.empty(0, dtype=torch.int64, device=DEVICE)).shape == (0,)


@pytest.mark.parametrize("normed", [True, False])
def test_the_draft_heads_fused_path_chooses_what_their_logits_do(monkeypatch, normed):
    """layers/fused_decoder.py ``head_argmax_tokens``, the drafts' greedy head (MTP, EAGLE3, DFlash), through
    the kernel (``fusable_rows`` forced on the CPU) and through logits then argmax: the same tokens, for rows
    gathered from a draft window and mapped to a target vocabulary."""
    from torch import nn

    from outpace.layers import fused_decoder
    from outpace.layers.norm import RMSNorm

    head = nn.Linear(48, 500, bias=False).to(DEVICE, DTYPE)
    head.weight.data = _rand(500, 48, seed=12)
    norm = RMSNorm(48, EPS).to(DEVICE, DTYPE) if normed else None
    if normed:
        norm.weight.data = _rand(48, seed=13)
    hidden = _rand(12, 48, seed=14) * 2
    rows = torch.tensor([11, 3], device=DEVICE)
    token_map = torch.arange(500, device=DEVICE) * 3 + 1
    with torch.no_grad():
        monkeypatch.setattr(fused_decoder, "fusable_rows", lambda x, w: False)
        unfused = fused_decoder.head_argmax_tokens(head, hidden, norm, rows, token_map=token_map)
        monkeypatch.setattr(fused_decoder, "fusable_rows", lambda x, w: True)
        fused = fused_decoder.head_argmax_tokens(head, hidden, norm, rows, token_map=token_map)
    assert torch.equal(fused, unfused)
    assert torch.equal(unfused % 3, torch.ones_like(unfused))  # through the map


@pytest.fixture(scope="module")
def nemotron_dir(tmp_path_factory):
    from helpers.hybrid_models import make_hybrid, save_hybrid

    return save_hybrid(make_hybrid("nemotron_h"), tmp_path_factory.mktemp("nemotron_h"))


@pytest.mark.parametrize(
    "target", ["tinypy", "tinyqwen35", "tinygemma", "tinygemma-capped", "nemotron"]
)
def test_the_targets_greedy_heads_choose_what_their_logits_do(monkeypatch, target, request):
    """A target's ``greedy_tokens`` (a greedy step's verdict without logits, engine/decode_step.py ``_verify``)
    against the argmax of its ``compute_logits``, both through the kernels (``fusable_rows`` forced on the CPU):
    Llama's, Qwen3.5's, Nemotron-H's heads and Gemma's tied one, soft-capped (from the logits) or not."""
    from outpace.layers import fused_decoder
    from outpace.models.loader import load_model
    from outpace.zoo import zoo_dir

    path = (
        request.getfixturevalue("nemotron_dir")
        if target == "nemotron"
        else zoo_dir() / target.removesuffix("-capped")
    )
    model = load_model(path, DTYPE, DEVICE, progress=False)
    if target.endswith("-capped"):
        model.gemma = dataclasses.replace(model.gemma, final_logit_softcapping=0.5)
    hidden = _rand(6, model.config.hidden_size, seed=15) * 4
    rows = torch.tensor([5, 0, 2], device=DEVICE)
    monkeypatch.setattr(fused_decoder, "fusable_rows", lambda x, w: True)
    with torch.no_grad():
        want = model.compute_logits(hidden).argmax(-1)
        assert torch.equal(model.greedy_tokens(hidden), want)
        assert torch.equal(model.greedy_tokens(hidden, rows), want[rows])
