"""Gated paged attention (attention/triton_kernels.py ``paged_attention``'s ``out_gate``): the kernel that
stores the output (the attention kernel without split-KV, the combine with it; the batch-invariant combine
in deterministic mode) multiplies it by sigmoid(gate) itself, with the arithmetic of the launch it replaces
(``sigmoid_gate_triton``, layers/fused_kernels.py): in Triton's interpreter the bits of the ungated attention
followed by that launch, and ``sigmoid_gate_torch``'s values (torch's exp may round the last bit otherwise).
In bf16 on the GPU (``test_bf16_8b_shape``) decode gives those bits; verify tiles differ in a few elements by
one bf16 ulp (1 to 3 of 131072 on the H200: benchmarks/scripts/diag_gated_attention_bits.py, gpu_2026-12-01f
call 4, the same with the gate contiguous; the gated kernel is another compilation of the attention, where
the last bit was not traced further).

Gates one logit per head (Step-3.5) and one per element (Qwen3-Next), contiguous or strided views of a
wider packed projection, in float32 or in the output's dtype; float32 and float16 attention (the interpreter
runs float16; bf16 is checked on the GPU); decode with one and several KV splits, chain verify of widths
2..8, tree masks, a sliding window, an FP8 cache, the batch-invariant kernels. Every buffer the kernels
allocate is poisoned, so a lane the gated store forgets shows up. Without CUDA the kernels run in Triton's
interpreter (conftest.py)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from helpers.attention_cases import DEVICE, Case, make_case, poisoned_allocations
from outpace.attention.context import forward_settings
from outpace.attention.kv_quant import FP8_KV_DTYPE, quantize
from outpace.attention.triton_kernels import paged_attention, write_kv
from outpace.layers.activation import sigmoid_gate, sigmoid_gate_torch
from outpace.layers.fused_kernels import sigmoid_gate_triton

GATES = ["head", "head-packed", "element", "element-packed"]
# (attention dtype, gate dtype): a fused projection's float32 products, or the model's dtype
DTYPES = [
    (torch.float32, torch.float32),
    (torch.float16, torch.float32),
    (torch.float16, torch.float16),
]


def make_gate(kind: str, case: Case, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """Gate logits for ``case``'s output: [num_tokens, heads] (one a head) or [num_tokens, heads, head_dim]
    (one an element); the packed kinds are views of a wider projection, as the fused kernels leave them."""
    num_tokens, heads, head_dim = case.q.shape
    g = torch.Generator().manual_seed(seed)

    def logits(*shape):  # wide enough that sigmoid saturates on some
        return (4 * torch.randn(*shape, generator=g)).to(DEVICE, dtype)

    if kind == "head":
        return logits(num_tokens, heads)
    if kind == "head-packed":  # Step-3.5: the last columns of [q | k | v | gate]
        return logits(num_tokens, 2 * heads * head_dim + heads)[:, -heads:]
    if kind == "element":
        return logits(num_tokens, heads, head_dim)
    # Qwen3-Next: each q head beside its gate head, [q head 0 | gate head 0 | q head 1 | ...]
    return logits(num_tokens, heads, 2, head_dim)[:, :, 1]


def run(
    case: Case, gate: torch.Tensor, kv_scales=None, **kwargs
) -> tuple[torch.Tensor, torch.Tensor]:
    """(the gated output, the ungated one) of the Triton kernels over fresh copies of the caches."""
    k_cache, v_cache = case.k_cache.clone(), case.v_cache.clone()
    table = write_kv(case.k, case.v, k_cache, v_cache, case.meta, kv_scales)
    args = (case.q, k_cache, v_cache, case.meta, table, case.scale)
    plain = paged_attention(*args, kv_scales=kv_scales, **kwargs)
    with poisoned_allocations():
        gated = paged_attention(*args, kv_scales=kv_scales, out_gate=gate, **kwargs)
    return gated, plain


def assert_gated(gated: torch.Tensor, plain: torch.Tensor, gate: torch.Tensor) -> None:
    """gated is plain times sigmoid(gate): bit for bit as the separate launch, as torch within its dtype."""
    per_head = gate if gate.dim() == 3 else gate[..., None]
    assert gated.dtype == plain.dtype and gated.shape == plain.shape
    assert not gated.isnan().any()
    assert torch.equal(gated, sigmoid_gate_triton(plain, per_head))
    torch.testing.assert_close(gated, sigmoid_gate_torch(plain, per_head))


def check(case: Case, kind: str, gate_dtype=torch.float32, seed=0, **kwargs) -> None:
    gate = make_gate(kind, case, gate_dtype, seed)
    assert_gated(*run(case, gate, **kwargs), gate)


@pytest.mark.parametrize("num_splits", [1, 4])
@pytest.mark.parametrize("dtypes", DTYPES, ids=lambda d: "{}-gate-{}".format(*d))
@pytest.mark.parametrize("kind", GATES)
def test_decode(kind, dtypes, num_splits):
    """One split (the attention kernel stores) and several (the combine stores)."""
    dtype, gate_dtype = dtypes
    case = make_case(
        [37, 5, 70],
        [1, 1, 1],
        block_size=16,
        head_dim=16,
        heads=4,
        kv_heads=2,
        dtype=dtype,
        seed=num_splits,
    )
    check(case, kind, gate_dtype, num_splits=num_splits)


@pytest.mark.parametrize("num_splits", [None, 1, 3])
@pytest.mark.parametrize("kind", ["head-packed", "element-packed"])
def test_verify_widths(kind, num_splits):
    """Chain verify of widths 2..8 in one ragged batch, rows crossing blocks of an odd size (GQA 3)."""
    case = make_case(
        [5, 20, 0, 9, 33, 2, 14],
        [2, 3, 4, 5, 6, 7, 8],
        block_size=6,
        head_dim=12,
        heads=6,
        kv_heads=2,
        seed=7,
    )
    check(case, kind, num_splits=num_splits, seed=1)


@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("kind", ["head-packed", "element-packed"])
def test_tree_mask(kind, num_splits):
    case = make_case(
        [30, 12, 50], [5, 8, 3], [9, 8, 7], block_size=16, head_dim=16, heads=4, kv_heads=2, seed=3
    )
    check(case, kind, num_splits=num_splits, seed=2)


def causal_positions(case: Case) -> torch.Tensor:
    """[num_tokens]: each new token's position (its KV row, causal layouts)."""
    m = case.meta
    return (m.seq_lens - m.query_lens)[m.token_seq_index] + m.token_query_index


@pytest.mark.parametrize("num_splits", [1, 4])
@pytest.mark.parametrize("kind", ["head", "element-packed"])
def test_sliding_window(kind, num_splits):
    case = make_case([37, 5, 90], [1, 4, 6], block_size=8, head_dim=16, heads=4, kv_heads=2, seed=4)
    window = 10
    check(
        case, kind, num_splits=num_splits, sliding_window=window, positions=causal_positions(case)
    )


@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("kind", ["head-packed", "element"])
def test_fp8_cache(kind, num_splits):
    case = make_case(
        [37, 5, 60], [1, 3, 1], block_size=16, head_dim=16, heads=4, kv_heads=2, seed=5
    )
    scales = (torch.tensor(0.05, device=DEVICE), torch.tensor(0.03, device=DEVICE))
    case.k_cache = quantize(case.k_cache, scales[0], FP8_KV_DTYPE)
    case.v_cache = quantize(case.v_cache, scales[1], FP8_KV_DTYPE)
    check(case, kind, num_splits=num_splits, kv_scales=scales)


@pytest.mark.parametrize(
    "layout",
    [
        ([37, 5, 70], [1, 1, 1], None),
        ([20, 45, 7], [2, 5, 8], None),
        ([30, 12, 50], [5, 8, 3], [9, 8, 7]),
    ],
    ids=["decode", "verify", "tree"],
)
@pytest.mark.parametrize("kind", ["head-packed", "element-packed"])
def test_batch_invariant(kind, layout):
    """The batch-invariant combine stores the gated output; rows over several 32-row splits."""
    case = make_case(*layout, block_size=16, head_dim=16, heads=4, kv_heads=2, seed=6)
    with forward_settings(batch_invariant=True):
        check(case, kind, split_rows=32, seed=3)


def test_sliding_window_batch_invariant():
    case = make_case([37, 5, 90], [1, 4, 6], block_size=8, head_dim=16, heads=4, kv_heads=2, seed=8)
    with forward_settings(batch_invariant=True):
        check(
            case,
            "element-packed",
            split_rows=32,
            sliding_window=10,
            positions=causal_positions(case),
        )


@pytest.mark.parametrize(
    "gate, message",
    [
        (lambda n, h, d: torch.randn(n, h, dtype=torch.float16), "float32 or"),
        (lambda n, h, d: torch.randn(n, h, 1), r"\[num_tokens, heads\]"),
        (lambda n, h, d: torch.randn(n, h + 1, d), r"\[num_tokens, heads\]"),
    ],
    ids=["dtype", "per-head-as-3d", "heads"],
)
def test_refuses_a_gate_it_cannot_apply(gate, message):
    case = make_case([5], [1], head_dim=16, heads=4, kv_heads=2)
    with pytest.raises(ValueError, match=message):
        run(case, gate(*case.q.shape).to(DEVICE))


def test_step3p5_fused_layers_gate_inside_the_attention_launch(tmp_path, monkeypatch):
    """Step-3.5's fused decode (models/step3p5.py ``attend_rows``, the packed head-wise gate): every layer
    hands its gate's float32 products [num_tokens, heads] to the attention and launches no ``sigmoid_gate``
    (tests/models/test_step3p5_fused.py checks the logits against the eager path)."""
    import outpace.attention.triton_backend as triton_backend
    import outpace.models.step3p5 as step3p5
    from helpers.fused_decode import decode_forward
    from helpers.step3p5_checkpoints import CONFIG, write_checkpoint

    cfg = {
        **CONFIG,
        "head_dim": 16,
        "attention_other_setting": {**CONFIG["attention_other_setting"], "head_dim": 16},
    }
    path, _ = write_checkpoint(tmp_path, cfg)
    gates, separate = [], []  # of the decode forward's 3 tokens (the prefill before it runs eager)

    def attention(q, *args, out_gate=None, **kwargs):
        if q.shape[0] == 3:
            gates.append(None if out_gate is None else (tuple(out_gate.shape), out_gate.dtype))
        return paged_attention(q, *args, out_gate=out_gate, **kwargs)

    def gate_launch(x, gate):
        if x.shape[0] == 3:
            separate.append(gate.shape)
        return sigmoid_gate(x, gate)

    monkeypatch.setattr(triton_backend, "paged_attention", attention)
    monkeypatch.setattr(step3p5, "sigmoid_gate", gate_launch)
    decode_forward(path, monkeypatch, torch.float32, lambda x, w: True)
    heads = [
        cfg["num_attention_heads"] if t == "full_attention" else 6
        for t in cfg["layer_types"][: cfg["num_hidden_layers"]]
    ]
    assert gates == [((3, h), torch.float32) for h in heads] and separate == []


@pytest.mark.gpu  # bf16 attention needs the GPU
@pytest.mark.parametrize(
    "invariant, num_splits",
    [(False, 1), (False, 8), (True, None)],
    ids=["one-split", "split", "invariant"],
)
@pytest.mark.parametrize("new", [[1] * 8, [4] * 8], ids=["decode", "verify"])
@pytest.mark.parametrize(
    "kind, gate_dtype",
    [
        ("head-packed", torch.float32),
        ("element-packed", torch.float32),
        ("element", torch.bfloat16),
    ],
)
def test_bf16_8b_shape(kind, gate_dtype, new, invariant, num_splits):
    """bf16 at Llama-8B's head shape over long contexts: the gated store against attention then
    ``sigmoid_gate`` (on the GPU, the Triton launch): bit for bit in decode; in verify at most one bf16 ulp
    apart, in at most 1 element in 10^4 (module docstring)."""
    cached = [3000, 700, 1500, 64, 2048, 33, 900, 1200]
    case = make_case(
        cached, new, block_size=16, head_dim=128, heads=32, kv_heads=8, dtype=torch.bfloat16, seed=9
    )
    gate = make_gate(kind, case, gate_dtype, seed=4)
    with forward_settings(batch_invariant=invariant):
        gated, plain = run(case, gate, num_splits=num_splits)
    per_head = gate if gate.dim() == 3 else gate[..., None]
    separate = sigmoid_gate(plain, per_head)
    if new[0] == 1:
        assert torch.equal(gated, separate)
    else:  # (bf16 bit patterns: one ulp is one step of the 16-bit integer, within a sign)
        steps = (gated.view(torch.int16).int() - separate.view(torch.int16).int()).abs()
        assert steps.max() <= 1 and (steps > 0).sum() <= gated.numel() // 10_000
    torch.testing.assert_close(gated, sigmoid_gate_torch(plain, per_head))
