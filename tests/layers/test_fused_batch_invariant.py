"""The fused projections (layers/fused_projection.py) in batch-invariant mode: any number of rows, in
tiles of 16 on a grid axis of their own, with tiles chosen from N and K only, so a row's output bits do
not depend on how many rows share the call (1, 3, 8, 17: part of a tile, one, two) nor on where the row
sits among them. On the CPU the kernels run in Triton's interpreter (float32, its dots row by row:
tests/conftest.py); without the row grid the 17th row of a call is never computed. The fused Llama layer
in that mode: a chain of tokens verified in one forward gets the bits of the same tokens decoded one by
one. On the GPU (bf16, the real dispatch): every entry point's rows at Llama-8B widths."""

from __future__ import annotations

from typing import Callable

import pytest
import torch

pytest.importorskip("triton")

from outpace.attention.context import forward_settings  # noqa: E402
from outpace.layers.fused_projection import (
    fused_rows_apply,
    norm_project,
    norm_project_qkv,
    norm_project_swiglu,
    project_add,
    project_add_normed,
    project_normed,
)  # noqa: E402
from outpace.layers.normed_rows import NormedRows, add_normed, normed_rows  # noqa: E402
from outpace.layers.rotary import RotaryEmbedding  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
EPS = 1e-5
ROW_COUNTS = (1, 3, 8, 17)
ROWS = 17  # the most rows of any call: two row tiles

Case = Callable[[slice], tuple]  # rows -> the per-row outputs of those rows, each [rows, ...]


def _rand(*shape, seed: int, scale: float = 1.0, dtype=torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(DEVICE, dtype)


def _per_row(out) -> tuple:
    """A kernel's outputs as tensors with one row per input row (NormedRows: its three)."""
    if isinstance(out, NormedRows):
        return (out.stream, out.normed, out.sq_parts.T)
    return (out,)


def projection_cases(k: int, n: int, dtype: torch.dtype) -> dict[str, Case]:
    """Every fused entry point but q/k/v over x [ROWS, k] (outputs n wide), as a function of the rows it
    is called on."""
    x, res = _rand(ROWS, k, seed=1, dtype=dtype), _rand(ROWS, n, seed=2, dtype=dtype)
    w = _rand(n, k, seed=3, scale=k**-0.5, dtype=dtype)
    w_next = _rand(n, n, seed=4, scale=n**-0.5, dtype=dtype)
    gate_up = _rand(2 * n, k, seed=5, scale=k**-0.5, dtype=dtype)
    norm_w, next_w = (
        1 + 0.1 * _rand(k, seed=6, dtype=dtype),
        1 + 0.1 * _rand(n, seed=7, dtype=dtype),
    )
    return {
        "project_add": lambda r: _per_row(project_add(x[r], w, res[r])),
        "project_add_normed": lambda r: _per_row(project_add_normed(x[r], w, res[r], next_w)),
        "norm_project": lambda r: _per_row(norm_project(normed_rows(x[r], norm_w), EPS, w)),
        "norm_project_softcapped_float32": lambda r: _per_row(
            norm_project(normed_rows(x[r], norm_w), EPS, w, torch.float32, softcap=2.0)
        ),
        "norm_project_behind_a_fused_stream": lambda r: _per_row(
            norm_project(project_add_normed(x[r], w, res[r], next_w), EPS, w_next)
        ),
        "norm_project_swiglu_silu": lambda r: _per_row(
            norm_project_swiglu(normed_rows(x[r], norm_w), EPS, gate_up)
        ),
        "norm_project_swiglu_gelu_tanh": lambda r: _per_row(
            norm_project_swiglu(
                normed_rows(x[r], norm_w, 1.0), EPS, gate_up, act="gelu_pytorch_tanh"
            )
        ),
        "sandwich_norm_add": lambda r: _per_row(
            add_normed(project_normed(x[r], w, next_w, 1.0), EPS, res[r], (next_w, 0.0))
        ),
    }


def qkv_case(qk_norm: bool, v_norm: bool, k: int, dtype: torch.dtype, heads=(4, 2, 32)) -> Case:
    """norm_project_qkv over x [ROWS, k]: q, and the k and v rows it writes at each row's cache slot."""
    num_heads, kv_heads, head_dim = heads
    q_size, kv_size = num_heads * head_dim, kv_heads * head_dim
    x, norm_w = _rand(ROWS, k, seed=11, dtype=dtype), 1 + 0.1 * _rand(k, seed=12, dtype=dtype)
    w = _rand(q_size + 2 * kv_size, k, seed=13, scale=k**-0.5, dtype=dtype)
    q_norm, k_norm = _rand(head_dim, seed=14, dtype=dtype), _rand(head_dim, seed=15, dtype=dtype)
    rotary = RotaryEmbedding(head_dim, 512, 10000.0, None)
    cos, sin = rotary.cos.to(DEVICE), rotary.sin.to(DEVICE)
    positions = torch.randint(0, 512, (ROWS,), generator=torch.Generator().manual_seed(16))
    slots = torch.randperm(12 * 4, generator=torch.Generator().manual_seed(17))[:ROWS]
    positions, slots = positions.to(DEVICE), slots.to(DEVICE)

    def run(r: slice) -> tuple:
        k_cache = torch.zeros(12, 4, kv_heads, head_dim, device=DEVICE, dtype=dtype)
        v_cache = torch.zeros_like(k_cache)
        q = norm_project_qkv(
            normed_rows(x[r], norm_w),
            EPS,
            w,
            head_dim,
            q_size,
            positions[r],
            cos,
            sin,
            k_cache,
            v_cache,
            slots[r],
            qk_norm=(q_norm, k_norm, EPS) if qk_norm else None,
            v_norm=v_norm,
        )
        return q, k_cache.view(-1, kv_size)[slots[r]], v_cache.view(-1, kv_size)[slots[r]]

    return run


def assert_rows_keep_their_bits(case: Case) -> None:
    """Every count of rows at several offsets gives its rows the bits the call over all ROWS gives."""
    full = case(slice(0, ROWS))
    assert all(t.shape[0] == ROWS for t in full)
    for m in ROW_COUNTS:
        for o in sorted({0, 5, ROWS - m}):
            for got, expected in zip(case(slice(o, o + m)), full):
                assert torch.equal(got, expected[o : o + m]), f"rows {o}..{o + m - 1}"


@pytest.mark.parametrize("name", list(projection_cases(8, 8, torch.float32)))
def test_a_rows_bits_do_not_depend_on_the_row_count(name):
    """An odd K (two K steps and a ragged tail in float32) and an odd N."""
    with forward_settings(batch_invariant=True):
        assert_rows_keep_their_bits(projection_cases(k=200, n=70, dtype=torch.float32)[name])


@pytest.mark.parametrize("qk_norm,v_norm", [(False, False), (True, False), (True, True)])
def test_qkv_rows_and_their_cache_writes_do_not_depend_on_the_row_count(qk_norm, v_norm):
    with forward_settings(batch_invariant=True):
        assert_rows_keep_their_bits(qkv_case(qk_norm, v_norm, k=72, dtype=torch.float32))


@pytest.mark.gpu  # the real dispatch: CUDA tensors only
def test_the_fused_path_serves_any_row_count_in_batch_invariant_mode_only():
    w = torch.zeros(8, 4, dtype=torch.bfloat16, device=DEVICE)
    rows = {m: torch.zeros(m, 4, dtype=torch.bfloat16, device=DEVICE) for m in (16, 17, 300)}
    with torch.inference_mode():
        assert fused_rows_apply(rows[16], w) and not fused_rows_apply(rows[17], w)
        with forward_settings(batch_invariant=True):
            assert all(fused_rows_apply(x, w) for x in rows.values())


@pytest.mark.gpu  # bf16 at the Llama-8B widths: GPU only
@pytest.mark.parametrize("width", ["o_proj", "head"])
def test_gpu_bf16_rows_do_not_depend_on_the_row_count(width):
    """On the GPU the instruction a tile runs is the hardware's: 1..17 rows at the 8B widths (o_proj /
    down: 4096 outputs; the head-wide plain tiles: 16384), every entry point."""
    n = 4096 if width == "o_proj" else 16384
    with torch.inference_mode(), forward_settings(batch_invariant=True):
        for case in projection_cases(k=4096, n=n, dtype=torch.bfloat16).values():
            assert_rows_keep_their_bits(case)
        assert_rows_keep_their_bits(qkv_case(True, False, 4096, torch.bfloat16, (32, 8, 128)))


# ---- the fused Llama layers: verify == decode, bit for bit -------------------------------------------------


def _llama_logits(tmp_path, monkeypatch, steps: list[list[int]]) -> list[torch.Tensor]:
    """A random two-layer Llama (float32) on the fused path in batch-invariant mode, Triton backend:
    two prompts (29 rows: two row tiles) prefilled, then each forward of ``steps`` (per step, the new
    tokens of each sequence: 1 each decodes, more verifies a chain) -> each step's logits [rows, vocab]."""
    import outpace.layers.fused_decoder as fused_decoder
    from helpers.spec_models import random_llama
    from outpace.attention import build_paged_metadata, forward_context
    from outpace.attention.triton_backend import TritonAttentionBackend
    from outpace.cache.block_pool import BlockPool
    from outpace.cache.kv_cache import bind_kv_cache
    from outpace.models.loader import load_model

    path = tmp_path / "llama"
    if not path.exists():
        random_llama(path, vocab_size=50, seed=0, std=0.2)
    model = load_model(path, torch.float32, DEVICE, progress=False)
    backend, tables, lens = TritonAttentionBackend(), [[3, 1], [0, 4]], [9, 20]
    bind_kv_cache(model, BlockPool(6, 16), torch.float32, DEVICE)
    calls = []
    monkeypatch.setattr(fused_decoder, "fusable_rows", lambda x, w: calls.append(1) or True)

    def forward(tokens: list[list[int]], cached: list[int]) -> torch.Tensor:
        """tokens: each sequence's new tokens, after its ``cached`` ones -> their logits [rows, vocab]."""
        ids = torch.tensor([t for seq in tokens for t in seq], device=DEVICE)
        positions = [c + j for c, seq in zip(cached, tokens) for j in range(len(seq))]
        meta = build_paged_metadata(tables, cached, [len(s) for s in tokens], 16, DEVICE)
        with forward_context(meta, backend):
            hidden = model(ids, torch.tensor(positions, device=DEVICE)).hidden_states
            return model.compute_logits(hidden)

    out = []
    with torch.inference_mode(), forward_settings(batch_invariant=True):
        forward([[t % 50 for t in range(n)] for n in lens], [0, 0])
        for step in steps:
            out.append(forward(step, lens))
            lens = [c + len(s) for c, s in zip(lens, step)]
    monkeypatch.undo()
    assert calls, "the fused path did not run"
    return out


def test_fused_layers_verify_a_chain_with_the_bits_of_decoding_it(tmp_path, monkeypatch):
    """Nine tokens of each of two sequences verified in one forward (18 rows) get, row for row, the
    logits of the same tokens decoded one step at a time (2 rows a step)."""
    chains = [[7, 3, 11, 5, 40, 2, 9, 30, 1], [12, 8, 0, 44, 6, 19, 25, 4, 33]]
    (verified,) = _llama_logits(tmp_path, monkeypatch, [chains])
    decoded = _llama_logits(
        tmp_path, monkeypatch, [[[a], [b]] for a, b in zip(*chains)]
    )  # [2, vocab] a step
    for j, step in enumerate(decoded):
        assert torch.equal(verified[j], step[0]), f"sequence 0, token {j}"
        assert torch.equal(verified[9 + j], step[1]), f"sequence 1, token {j}"
