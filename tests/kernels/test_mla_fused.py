"""The fused few-row MLA block (layers/mla_fused.py) against the eager layer (layers/mla.py under the torch
backend): in Triton's interpreter in float32 at odd shapes (kv_lora_rank 36, three heads, nope 6, rope 8,
v 5, with and without a q_lora_rank, both RoPE layouts, one, two and four query-latent parts), for decode, verify
chains of 2 to 8 tokens and tree masks over shuffled paged blocks of an odd size: the same output and the
same latent cache; fp16 too; every projection in block FP8 (128 x 128 scales over weights of whole and
partial blocks), where a scale divided instead of multiplied fails; which quantized formats fuse; the input
norm folded into the down projections (a fused residual stack's stream, ``NormedRows``) against the RMSNorm
then the eager layer, in float32 and block FP8; and the kernels compile for sm_90, bf16 and FP8 weights (no GPU needed). On the GPU (skipped without CUDA): bf16 at DeepSeek-V2-Lite's, Kimi-K2's and
V3's shapes against the eager layer in float32, block FP8 at DeepSeek-V2-Lite's and Kimi-K2's against the
eager layer over the dequantized weights, and the block's kernel launches and time, bf16 and FP8 (``-s``
prints them)."""

from __future__ import annotations

import copy

import pytest
import torch

pytest.importorskip("triton")

import outpace.layers.mla as mla_module
from helpers.hopper_compile import run_compile_script
from helpers.mla_layers import make_layer
from outpace.attention import build_paged_metadata, forward_context
from outpace.attention.registry import get_backend
from outpace.layers import mla_fused
from outpace.layers.linear import linear
from outpace.layers.mla import MLAShape, MultiHeadLatentAttention
from outpace.layers.norm import RMSNorm
from outpace.layers.normed_rows import NormedRows
from outpace.layers.quant import dequantize as dq
from outpace.layers.quant.linear import FORMATS, is_quantized, quantized_like
from outpace.layers.quant.scheme import FP8_BLOCK, FP8_TENSOR, INT4_GROUP, QuantScheme
from outpace.layers.skinny_gemm import MAX_ROWS

CUDA = torch.cuda.is_available()

# (cached rows, new tokens, tree window or None) per sequence; at most MAX_ROWS tokens in all
LAYOUTS = {
    "decode": ([37, 5, 130, 16], [1, 1, 1, 1], None),
    **{f"chain{k}": ([20, 3], [k, k], None) for k in range(2, 9)},
    "tree": ([30, 12], [5, 8], [9, 8]),
    "ragged_tree": ([33, 8, 0], [1, 6, 3], [None, 10, None]),
}
LONG_LAYOUTS = {  # the GPU's timings: one sequence at a serving context
    "long_decode": ([4000], [1], None),
    "long_chain4": ([4000], [4], None),
}


def tree_mask(q: int, window: int, g: torch.Generator) -> torch.Tensor:
    """[q, window] bool: a random tree over the window whose last q nodes are the new tokens; each row
    sees its node and the node's ancestors."""
    seen = torch.zeros(window, window, dtype=torch.bool)
    for node in range(window):
        parent = int(torch.randint(-1, node, (1,), generator=g)) if node else -1
        if parent >= 0:
            seen[node] = seen[parent]
        seen[node, node] = True
    return seen[window - q :]


def make_meta(layout: str, block_size: int, g: torch.Generator, device: str):
    """The layout's metadata over shuffled blocks (with unused ones between), and the pool's block count."""
    cached, new, windows = {**LAYOUTS, **LONG_LAYOUTS}[layout]
    needed = [-(-(c + q) // block_size) for c, q in zip(cached, new)]
    blocks = torch.randperm(sum(needed) + 3, generator=g)[: sum(needed)].tolist()
    tables = [blocks[sum(needed[:s]) : sum(needed[: s + 1])] for s in range(len(needed))]
    masks = None
    if windows is not None:
        masks = [None if w is None else tree_mask(q, w, g).to(device) for q, w in zip(new, windows)]
    return build_paged_metadata(tables, cached, new, block_size, device, masks), sum(needed) + 3


def run(layer, backend: str, meta, num_blocks: int, block_size: int, x, positions, cache_init):
    """The layer's output and its cache after the forward over a cache that starts as ``cache_init``."""
    layer.bind_cache(num_blocks, block_size, x.dtype, x.device)
    layer.cache_rows.copy_(cache_init.to(x.dtype))
    with torch.no_grad(), forward_context(meta, get_backend(backend)):
        return layer(positions, x), layer.cache_rows.clone()


def assert_fused_equals_eager(layer, args: tuple, fused_calls: list) -> None:
    """One forward of ``layer`` over ``args`` (``run``'s) on the fused path (``fused_calls`` counts it) gives
    the eager layer's output and latent cache."""
    out, cache = run(layer, "triton", *args)
    assert len(fused_calls) == 1
    ref_out, ref_cache = run(layer, "torch", *args)
    torch.testing.assert_close(out, ref_out, rtol=2e-5, atol=2e-5)
    torch.testing.assert_close(cache, ref_cache, rtol=2e-5, atol=2e-5)


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def positions_of(meta) -> torch.Tensor:
    return (meta.seq_lens - meta.query_lens)[meta.token_seq_index] + meta.token_query_index


@pytest.fixture(autouse=True)
def fused_on(monkeypatch):
    """The fused block is off by default (layers/mla.py ``fused``): these tests switch it on."""
    monkeypatch.setattr(mla_module.MultiHeadLatentAttention, "fused", True)


# The interpreter's checks run on CPU tensors: on a GPU machine (no interpreter) the compiled kernels are
# checked by the bf16 tests below instead.
cpu_only = pytest.mark.skipif(CUDA, reason="CPU tensors through Triton's interpreter")


@pytest.fixture
def fused_calls(monkeypatch):
    """Forces the fused path for up to MAX_ROWS rows on the CPU and counts its forwards."""
    calls = []
    real = mla_fused.mla_forward_fused
    monkeypatch.setattr(mla_module, "fusable_rows", lambda x, w: x.shape[0] <= MAX_ROWS)
    monkeypatch.setattr(mla_fused, "mla_forward_fused", lambda *a: calls.append(1) or real(*a))
    return calls


CASES = [
    (layout, q_lora_rank, interleaved, parts)
    for i, layout in enumerate(LAYOUTS)
    for q_lora_rank, interleaved, parts in [
        (None, i % 2 == 0, (1, 2, 4)[i % 3]),
        (20, i % 2 == 1, (4, 1, 2)[i % 3]),
    ]
]
# SMs that give three heads of nope 6 and rope 8 these query-latent parts (q_pe parts: 1, 2, 4), with a
# q_lora_rank; without one, the W_UK columns a program of ``absorb_kernel`` takes (R 36: 1, 2, 3 programs a
# head) when it may take as few as 16
SMS_FOR_PARTS = {1: 1, 2: 6, 4: 12}
R_CHUNKS = {1: 64, 2: 32, 4: 16}
SMS_FOR_R_CHUNK = {64: 1, 32: 3, 16: 6}


@cpu_only
@pytest.mark.parametrize("layout, q_lora_rank, interleaved, parts", CASES)
def test_fused_block_equals_the_eager_layer(
    layout, q_lora_rank, interleaved, parts, fused_calls, monkeypatch
):
    """Output and latent cache (the new rows where the slots say, every other row untouched)."""
    cpu = torch.device("cpu")
    if q_lora_rank is None:
        chunk = R_CHUNKS[parts]
        monkeypatch.setattr(mla_fused, "min_r_chunk", 16)
        monkeypatch.setattr(mla_fused, "num_sms", lambda device: SMS_FOR_R_CHUNK[chunk])
        assert mla_fused.r_chunk(3, 36, cpu) == chunk
    else:
        monkeypatch.setattr(mla_fused, "num_sms", lambda device: SMS_FOR_PARTS[parts])
        assert mla_fused.q_parts(3, 6, 8, cpu) == (parts, {1: 1, 2: 2, 4: 4}[parts])
    shape = MLAShape(40, 3, q_lora_rank, 36, 6, 8, 5, scale=0.3)
    layer = make_layer(shape, interleaved, "cpu")
    g = torch.Generator().manual_seed(len(layout) + (q_lora_rank or 0))
    meta, num_blocks = make_meta(layout, 5, g, "cpu")
    n = meta.slot_mapping.shape[0]
    x = torch.randn(n, 40, generator=g)
    cache_init = torch.randn(num_blocks, 5, 1, 44, generator=g)
    args = (meta, num_blocks, 5, x, positions_of(meta), cache_init)
    assert_fused_equals_eager(layer, args, fused_calls)


def test_launch_shapes_at_the_deepseek_shapes_on_an_h200(monkeypatch):
    """What the launchers pick on 132 SMs (the measurements behind them: layers/mla_fused.py): the down
    kernel's outputs a program, 32 for DeepSeek-V2-Lite's q_proj + kv_a in bf16 and block FP8 (16 would leave
    a partial second wave), 16 for V3's / Kimi-K2's q_a + kv_a (one wave); V2-Lite's W_UK in
    64-column slices (eight programs a head); Kimi-K2's and V3's query latent in 2 and 1 parts."""
    monkeypatch.setattr(mla_fused, "num_sms", lambda device: 132)
    device = torch.device("cpu")  # (an H200's 132 SMs through num_sms)
    assert mla_fused._down_outs(16 * 192 + 576, device) == 32
    assert mla_fused._down_outs(1536 + 576, device) == 16
    assert mla_fused.r_chunk(16, 512, device) == 64
    assert mla_fused.q_parts(64, 128, 64, device)[0] == 2
    assert mla_fused.q_parts(128, 128, 64, device)[0] == 1


@cpu_only
@pytest.mark.parametrize("q_lora_rank", [None, 24])
def test_q_pe_in_parts_and_the_whole_k_pe_written(q_lora_rank, fused_calls, monkeypatch):
    """Rope 64 (32 rotation pairs, more than a q_pe program's 16-wide tile): with a q_lora_rank q_pe in eight
    parts of 4 pairs, without one whole in a head's first program; the kv rows' program still rotates and
    writes all 32 pairs of k_pe."""
    monkeypatch.setattr(mla_fused, "num_sms", lambda device: 12)
    assert mla_fused.q_parts(2, 32, 64, torch.device("cpu")) == (4, 8)
    layer = make_layer(MLAShape(48, 2, q_lora_rank, 20, 32, 64, 8, scale=0.3), True, "cpu")
    g = torch.Generator().manual_seed(3)
    meta, num_blocks = make_meta("chain4", 5, g, "cpu")
    x = torch.randn(meta.slot_mapping.shape[0], 48, generator=g)
    cache_init = torch.randn(num_blocks, 5, 1, 84, generator=g)
    args = (meta, num_blocks, 5, x, positions_of(meta), cache_init)
    assert_fused_equals_eager(layer, args, fused_calls)


@cpu_only
def test_half_precision(fused_calls):
    """The half-precision code path (the kernels' casts and stores; Triton's interpreter computes fp16
    dots, not bf16 ones) against the eager layer in float32."""
    layer = make_layer(MLAShape(64, 4, 24, 64, 32, 16, 32, scale=0.2), True, "cpu")
    g = torch.Generator().manual_seed(1)
    meta, num_blocks = make_meta("tree", 16, g, "cpu")
    x = torch.randn(meta.slot_mapping.shape[0], 64, generator=g).half()
    cache_init = torch.randn(num_blocks, 16, 1, 80, generator=g)
    args = (meta, num_blocks, 16, x, positions_of(meta), cache_init)
    out, cache = run(copy.deepcopy(layer).half(), "triton", *args)
    assert fused_calls == [1] and out.dtype == cache.dtype == torch.float16
    ref_out, ref_cache = run(layer, "torch", *args[:3], x.float(), *args[4:])
    assert _relative(out, ref_out) < 3e-3
    assert _relative(cache, ref_cache) < 1e-3


@cpu_only
def test_the_eager_path_serves_what_the_fused_one_does_not(fused_calls, monkeypatch):
    """More rows than a few-row kernel takes, the torch backend, and (without the forcing) CPU tensors
    run the eager layer."""
    layer = make_layer(MLAShape(40, 3, 20, 36, 6, 8, 5, scale=0.3), True, "cpu")
    g = torch.Generator().manual_seed(3)
    for layout, backend in [("chain8", "torch"), ("decode", "torch")]:
        meta, num_blocks = make_meta(layout, 5, g, "cpu")
        x = torch.randn(meta.slot_mapping.shape[0], 40, generator=g)
        cache_init = torch.zeros(num_blocks, 5, 1, 44)
        run(layer, backend, meta, num_blocks, 5, x, positions_of(meta), cache_init)
    many = build_paged_metadata([[0, 1, 2, 3]], [0], [MAX_ROWS + 1], 5, "cpu")
    x = torch.randn(MAX_ROWS + 1, 40, generator=g)
    run(layer, "triton", many, 4, 5, x, positions_of(many), torch.zeros(4, 5, 1, 44))
    assert fused_calls == []
    monkeypatch.undo()
    monkeypatch.setattr(mla_module.MultiHeadLatentAttention, "fused", True)  # (undone above)
    meta, num_blocks = make_meta("decode", 5, g, "cpu")
    x = torch.randn(4, 40, generator=g)
    layer.bind_cache(num_blocks, 5, torch.float32, "cpu")
    with torch.no_grad(), forward_context(meta, get_backend("triton")):
        assert not layer.fuses(x)


# ---- block FP8 projections (DeepSeek-V3 and Kimi-K2 checkpoints: weight_block_size [128, 128]) ----------

FP8 = QuantScheme(FP8_BLOCK, "test", block=(128, 128))
# hidden 300: every down projection's K in two whole 128-column scale blocks and a partial one; q_lora_rank
# 136: q_a's rows and q_b's columns a whole block and a partial one; three heads of nope 38 and rope 8:
# q_b's (q_proj's) 138 rows, the last head across the edge of the two row blocks
FP8_SHAPES = {
    q_lora_rank: MLAShape(300, 3, q_lora_rank, 36, 38, 8, 5, scale=0.2)
    for q_lora_rank in (None, 136)
}


def quantize_projections(
    layer: MultiHeadLatentAttention,
    seed: int,
    scheme: QuantScheme = FP8,
    names: tuple[str, ...] | None = None,
    scale_dtype: torch.dtype = torch.float32,
) -> MultiHeadLatentAttention:
    """The projections ``names`` of ``layer`` (default: all) replaced by ``QuantizedLinear``s of ``scheme``
    holding their weights (rows rescaled at random, so that the blocks' scales differ), kv_b_proj's
    dequantized copy packed as after loading (layers/mla.py ``pack_rows``)."""
    g = torch.Generator().manual_seed(seed)
    fmt = FORMATS[scheme.method](scheme)
    if names is None:
        names = tuple(n for n, m in layer.named_children() if isinstance(m, torch.nn.Linear))
    for name in names:
        plain = getattr(layer, name)
        w = plain.weight.detach().float().cpu()
        w = w * (0.25 + 3 * torch.rand(w.shape[0], 1, generator=g))  # [out, in]
        if scheme.method == FP8_BLOCK:
            stored, scale = dq.quantize_fp8_block(w, scheme.block)
        elif scheme.method == FP8_TENSOR:
            stored, scale = dq.quantize_fp8_tensor(w)
        else:
            stored, scale = dq.quantize_int4_group(w, scheme.group)
        quantized = quantized_like(plain, fmt, scale_dtype, name)
        with torch.no_grad():
            quantized.stored_weight.copy_(stored)
            quantized.scale.copy_(scale.to(scale_dtype))
        setattr(layer, name, quantized)
    layer.pack_rows()
    return layer


def fp8_layer(q_lora_rank: int | None, device: str) -> MultiHeadLatentAttention:
    """``FP8_SHAPES[q_lora_rank]``, every projection in block FP8 (bf16 scales without a q_lora_rank, as
    some Qwen files store them; float32 with, as DeepSeek's)."""
    layer = make_layer(FP8_SHAPES[q_lora_rank], q_lora_rank is None, device)
    scale_dtype = torch.bfloat16 if q_lora_rank is None else torch.float32
    return quantize_projections(layer, seed=q_lora_rank or 1, scale_dtype=scale_dtype)


def fp8_args(layout: str) -> tuple:
    """``run``'s arguments after the backend for the ``FP8_SHAPES`` layers: the layout over blocks of 5 rows."""
    g = torch.Generator().manual_seed(len(layout))
    meta, num_blocks = make_meta(layout, 5, g, "cpu")
    x = torch.randn(meta.slot_mapping.shape[0], 300, generator=g)
    cache_init = torch.randn(num_blocks, 5, 1, 44, generator=g)
    return meta, num_blocks, 5, x, positions_of(meta), cache_init


def fp8_case(q_lora_rank: int | None, layout: str):
    """An FP8 layer and ``run``'s arguments after the backend (``fp8_args``)."""
    return fp8_layer(q_lora_rank, "cpu"), fp8_args(layout)


@cpu_only
@pytest.mark.parametrize("q_lora_rank", [None, 136])
@pytest.mark.parametrize(
    "layout, sms, columns",
    [("decode", 4, 1), ("chain5", 12, 1), ("ragged_tree", 12, 1), ("chain5", 12, 2)],
)
def test_block_fp8_projections_equal_the_eager_layer(
    q_lora_rank, layout, sms, columns, fused_calls, monkeypatch
):
    """The kernels read q_a, kv_a and q_b (or q_proj) in block FP8, W_UK and W_UV from the dequantized
    kv_b_proj, and o_proj runs as a module: the eager layer's output and latent cache (its projections
    dequantized: only float32 summation orders differ). One query-latent part on the interpreter's 4
    SMs, four on 12; K steps of one scale column, and of two (``fp8_scale_columns``: the scales of a
    step's two 128-column blocks, the last one partial over the 300 columns)."""
    monkeypatch.setattr(mla_fused, "num_sms", lambda device: sms)
    monkeypatch.setattr(mla_fused, "fp8_scale_columns", columns)
    layer, args = fp8_case(q_lora_rank, layout)
    assert_fused_equals_eager(layer, args, fused_calls)


@cpu_only
@pytest.mark.parametrize("q_lora_rank", [None, 136])
def test_per_tensor_fp8_projections_equal_the_eager_layer(q_lora_rank, fused_calls):
    """Per-tensor FP8 projections (Mistral Small 4's: one scale a weight) read by the kernels as 128 x 128 blocks
    of that scale (layers/mla_fused.py ``_operand``): the eager layer's output and latent cache; a doubled scale
    on q_b (or q_proj) or kv_a makes them differ (q_a's rows pass through its RMSNorm, which a common factor
    does not change)."""
    layer = make_layer(FP8_SHAPES[q_lora_rank], q_lora_rank is None, "cpu")
    layer = quantize_projections(
        layer, 3, QuantScheme(FP8_TENSOR, "test"), scale_dtype=torch.bfloat16
    )
    args = fp8_args("chain5")
    assert_fused_equals_eager(layer, args, fused_calls)
    ref_out, _ = run(layer, "torch", *args)
    for proj in layer.fused_projections():
        if proj is getattr(layer, "q_a_proj", None):
            continue
        right = proj.scale.clone()
        proj.scale.copy_(2 * right)
        out, _ = run(layer, "triton", *args)
        with pytest.raises(AssertionError):
            torch.testing.assert_close(out, ref_out, rtol=2e-5, atol=2e-5)
        proj.scale.copy_(right)


@cpu_only
@pytest.mark.parametrize("q_lora_rank", [None, 136])
@pytest.mark.parametrize("columns", [1, 2])
def test_a_wrong_scale_convention_fails(q_lora_rank, columns, fused_calls, monkeypatch):
    """The comparison above tells the conventions apart, for each projection the kernels read: scales
    divided instead of multiplied (the reciprocal scales), or the last (partial) block's scale doubled,
    make the fused block differ from the eager one, in K steps of one scale column or two."""
    monkeypatch.setattr(mla_fused, "fp8_scale_columns", columns)
    layer, args = fp8_case(q_lora_rank, "chain3")
    ref_out, ref_cache = run(layer, "torch", *args)
    for proj in layer.fused_projections():
        right = proj.scale.clone()
        corner = right.clone()
        corner[-1, -1] *= 2
        for wrong in (1 / right, corner):
            proj.scale.copy_(wrong)
            out, cache = run(layer, "triton", *args)
            with pytest.raises(AssertionError):
                torch.testing.assert_close(out, ref_out, rtol=2e-5, atol=2e-5)
                torch.testing.assert_close(cache, ref_cache, rtol=2e-5, atol=2e-5)
        proj.scale.copy_(right)
    assert len(fused_calls) == 2 * len(layer.fused_projections())


@cpu_only
def test_fuses_reads_block_fp8_and_leaves_other_formats_to_the_eager_path(fused_calls):
    """``fuses``: block FP8 q_a, q_b and kv_a (scale blocks of a power of two columns) fuse, and so do
    per-tensor FP8 ones (read as 128 x 128 blocks of one scale); INT4 on any of them, or block FP8 of 96
    columns a block, take the eager path; kv_b_proj and o_proj fuse in any format (read through
    ``up_weights`` and called as a module)."""
    shape = MLAShape(64, 2, 32, 32, 8, 8, 16, scale=0.3)
    int4 = QuantScheme(INT4_GROUP, "test", group=32)
    cases = [
        (FP8, None, True),
        (QuantScheme(FP8_BLOCK, "test", block=(64, 32)), None, True),
        (QuantScheme(FP8_BLOCK, "test", block=(128, 96)), ("kv_a_proj_with_mqa",), False),
        (QuantScheme(FP8_TENSOR, "test"), ("q_a_proj",), True),
        (int4, ("q_b_proj",), False),
        (int4, ("kv_a_proj_with_mqa",), False),
        (int4, ("kv_b_proj", "o_proj"), True),
        (QuantScheme(FP8_TENSOR, "test"), ("kv_b_proj", "o_proj"), True),
    ]
    meta, num_blocks = make_meta("decode", 5, torch.Generator().manual_seed(0), "cpu")
    x = torch.randn(4, 64)
    for scheme, names, fuses in cases:
        layer = quantize_projections(make_layer(shape, True, "cpu"), 0, scheme, names)
        layer.bind_cache(num_blocks, 5, torch.float32, "cpu")
        with torch.no_grad(), forward_context(meta, get_backend("triton")):
            assert layer.fuses(x) == fuses, (scheme, names)


# ---- the input norm folded into the down projections (a fused residual stack: models/deepseek.py) ------


def normed_rows_of(stream: torch.Tensor, weight: torch.Tensor, parts: int) -> NormedRows:
    """What a kernel that wrote the stream [n, hidden] hands on for the norm of weight ``weight`` after it
    (layers/normed_rows.py ``NormedRows``): stream * weight, and the stream's sums of squares in
    ``parts`` column slices [parts, n], as several programs of that kernel leave them."""
    sq = torch.stack([(part.float() ** 2).sum(1) for part in stream.tensor_split(parts, dim=1)])
    return NormedRows(stream, stream * weight, sq)


def assert_normed_rows_give_the_eager_layer(layer, args: tuple) -> None:
    """``attend_rows`` over ``args``' x taken as a residual stream made ready for an input norm (three partial
    sums of squares a row), then o_proj, gives the eager layer's output and latent cache over RMSNorm(stream)
    (layers/norm.py: the stream normalised, then the weight)."""
    meta, num_blocks, block_size, stream, positions, cache_init = args
    hidden = stream.shape[1]
    norm = RMSNorm(hidden, 1e-5)
    with torch.no_grad():
        norm.weight.copy_(0.5 + torch.rand(hidden, generator=torch.Generator().manual_seed(5)))
        x = norm(stream)
    ref_out, ref_cache = run(layer, "torch", meta, num_blocks, block_size, x, positions, cache_init)
    layer.bind_cache(num_blocks, block_size, stream.dtype, stream.device)
    layer.cache_rows.copy_(cache_init)
    with torch.no_grad(), forward_context(meta, get_backend("triton")):
        assert layer.fuses(stream)
        rows = normed_rows_of(stream, norm.weight, 3)
        out = layer.o_proj(layer.attend_rows(positions, rows, norm.eps))
    # (the norm's factor multiplies each K-long float32 dot, where the eager path scales every input: a few
    # ulps more; at 2e-5 one element of 3000 of the block-FP8 case strayed under a loaded machine's threads)
    torch.testing.assert_close(out, ref_out, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(layer.cache_rows, ref_cache, rtol=1e-4, atol=1e-4)


@cpu_only
@pytest.mark.parametrize("q_lora_rank", [None, 20])
@pytest.mark.parametrize("layout", ["decode", "chain5", "ragged_tree"])
def test_the_input_norm_folds_into_the_down_projections(q_lora_rank, layout, fused_calls):
    """``assert_normed_rows_give_the_eager_layer`` at the odd shapes, decode and verify widths: the down
    kernel scales each row's q (q_a or q_proj) and kv products by the input norm's factor. A stream far from
    unit scale, and a q_a norm eps of 0.5: q_a's sums of squares must be those of the normalised input's
    q_a (RMSNorm is scale-invariant but for its eps)."""
    layer = make_layer(MLAShape(40, 3, q_lora_rank, 36, 6, 8, 5, scale=0.3), True, "cpu")
    if q_lora_rank is not None:
        layer.q_a_layernorm.eps = 0.5
    g = torch.Generator().manual_seed(len(layout))
    meta, num_blocks = make_meta(layout, 5, g, "cpu")
    stream = 7 * torch.randn(meta.slot_mapping.shape[0], 40, generator=g)
    cache_init = torch.randn(num_blocks, 5, 1, 44, generator=g)
    args = (meta, num_blocks, 5, stream, positions_of(meta), cache_init)
    assert_normed_rows_give_the_eager_layer(layer, args)


@cpu_only
@pytest.mark.parametrize("q_lora_rank", [None, 136])
def test_the_input_norm_folds_into_block_fp8_down_projections(q_lora_rank, fused_calls):
    """The same over block FP8 projections (``fp8_case``): the norm's factor after each block's scale."""
    layer, args = fp8_case(q_lora_rank, "chain5")
    if q_lora_rank is not None:
        layer.q_a_layernorm.eps = 0.5
    assert_normed_rows_give_the_eager_layer(layer, args)


# Compiled for sm_90 (Hopper) without a GPU: what Triton's interpreter does not check (one name bound to
# two types in two branches, the PDL instructions). Kimi-K2's shape: q_lora_rank, two query-latent parts;
# the projections in bf16, in block FP8 (every one, and q_a alone beside a bf16 kv_a).
# (run after helpers/hopper_compile.py's preamble: compile_for_hopper, ptxas_report)
SM90_COMPILE = """
from outpace.attention import mla_kernels
from outpace.layers import mla_fused_kernels

bf16 = {n: "*bf16" for n in ("x_ptr", "wq_ptr", "wkv_ptr", "w_uk_ptr", "q_norm_ptr", "kv_norm_ptr",
        "cache_ptr", "q_parts_ptr", "q_pe_ptr", "up_ptr", "out_ptr")}
fp32 = {n: "*fp32" for n in ("q_sq_ptr", "sq_ptr", "kv_raw_ptr", "cos_ptr", "sin_ptr", "part_acc_ptr",
        "part_max_ptr", "part_sum_ptr", "wq_scale_ptr", "wkv_scale_ptr")}
types = {**bf16, **fp32, "eps": "fp32", "kv_eps": "fp32", "slot_ptr": "*i64", "pos_ptr": "*i64",
         "seq_index_ptr": "*i64", "query_index_ptr": "*i64", "seq_lens_ptr": "*i64",
         "query_lens_ptr": "*i64"}
fp8 = {"none": "*bf16", "fp8_block": "*fp8e4nv"}
scales = dict(SCALE_BN=128, SCALE_BK=128)
for q_format, kv_format in [("none", "none"), ("fp8_block", "fp8_block"), ("fp8_block", "none")]:
    down_types = {**types, "wq_ptr": fp8[q_format], "wkv_ptr": fp8[kv_format]}
    # (K steps as mla_forward_fused picks them: block FP8's over fp8_scale_columns = 4 scale columns)
    bk = 256 if q_format == kv_format == "none" else 512
    for q_normed in (True, False):  # (Kimi-K2's q_a_proj, 16 outputs a program; DeepSeek-V2-Lite's q_proj, 32)
        q_out = {"q_out_ptr": "*bf16" if q_normed else "*fp32"}
        for row_norm in (False, True):  # (x normalised; a fused stack's stream times the norm's weight)
            compile_for_hopper(mla_fused_kernels.down_kernel, {**down_types, **q_out}, dict(BM=16,
                               BN=16 if q_normed else 32,
                               BK=bk, PRECISION="tf32", PDL=True, PREFETCH_K=512, Q_FORMAT=q_format,
                               KV_FORMAT=kv_format, Q_NORMED=q_normed, ROW_NORM=row_norm, BLOCK_P=2,
                               **scales), 4, 4)
for q_format in ("none", "fp8_block"):
    compile_for_hopper(mla_fused_kernels.q_absorb_kernel, {**types, "wq_ptr": fp8[q_format]}, dict(HEADS=64,
                       NOPE=128, P=64, R=512, Q_PARTS=2, NOPE_CHUNK=64, PE_PARTS=1, PE_CHUNK=32,
                       BLOCK_NC=64, BLOCK_HP=32, BLOCK_KP=32,
                       BLOCK_R=512, BLOCK_SQ=128, BR=128, BM=16, BK=128 if q_format == "none" else 256,
                       INTERLEAVED=True, PRECISION="tf32", PDL=True, PREFETCH_K=512,
                       Q_FORMAT=q_format, **scales), 4, 3)
compile_for_hopper(mla_fused_kernels.absorb_kernel, {**types, "q_ptr": "*fp32", "q_latent_ptr": "*bf16"},
                   dict(HEADS=16, NOPE=128, P=64, R=512, R_PARTS=8, R_CHUNK=64, PREFETCH_LINES=1,
                        BLOCK_NOPE=128, BLOCK_HP=32, BLOCK_R=512, BR=64, BM=16, INTERLEAVED=True,
                        PRECISION="tf32", PDL=True), 4, 1)
compile_for_hopper(mla_kernels._combine_kernel, types, dict(HEADS=64, R=512, OUT=128, BLOCK_R=512,
                   CHUNK=64, BLOCK_T=16, BLOCK_M=32, BLOCK_N=32, HAS_MASK=True, UP=True,
                   PRECISION="tf32", PDL=True), 4, 3)
"""


def test_the_kernels_compile_for_hopper(tmp_path):
    done = run_compile_script(SM90_COMPILE, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]


# ---- GPU: bf16 at the DeepSeek shapes ---------------------------------------------------------------

GPU_SHAPES = {  # DeepSeek-V2-Lite's, Kimi-K2's and DeepSeek-V3's attention (their config.json files)
    "v2-lite": MLAShape(2048, 16, None, 512, 128, 64, 128, scale=192**-0.5),
    "kimi-k2": MLAShape(7168, 64, 1536, 512, 128, 64, 128, scale=192**-0.5),
    "v3": MLAShape(7168, 128, 1536, 512, 128, 64, 128, scale=192**-0.5),
}


def _gpu_case(name: str, layout: str):
    shape = GPU_SHAPES[name]
    layer = make_layer(shape, True, "cuda").to(torch.bfloat16)
    g = torch.Generator().manual_seed(7)
    meta, num_blocks = make_meta(layout, 16, g, "cuda")
    n = meta.slot_mapping.shape[0]
    x = torch.randn(n, shape.hidden_size, generator=g).cuda()
    width = shape.kv_lora_rank + shape.qk_rope_head_dim
    cache_init = torch.randn(num_blocks, 16, 1, width, generator=g).cuda()
    return layer, (meta, num_blocks, 16, x, positions_of(meta), cache_init)


@pytest.mark.gpu  # bf16 at the DeepSeek shapes: GPU only
@pytest.mark.parametrize("name", list(GPU_SHAPES))
@pytest.mark.parametrize("layout", ["decode", "chain4", "chain8", "tree"])
def test_bf16_at_the_deepseek_shapes(name, layout, monkeypatch):
    calls = []
    real = mla_fused.mla_forward_fused
    monkeypatch.setattr(mla_fused, "mla_forward_fused", lambda *a: calls.append(1) or real(*a))
    layer, (meta, num_blocks, block_size, x, positions, cache_init) = _gpu_case(name, layout)
    out, cache = run(
        layer, "triton", meta, num_blocks, block_size, x.bfloat16(), positions, cache_init
    )
    assert calls == [1]
    reference = copy.deepcopy(layer).float()
    ref_out, ref_cache = run(
        reference,
        "torch",
        meta,
        num_blocks,
        block_size,
        x.bfloat16().float(),
        positions,
        cache_init,
    )
    assert _relative(out, ref_out) < 2e-2
    assert _relative(cache, ref_cache) < 1e-2


def _launches_and_time(layer, case, monkeypatch) -> dict[str, tuple[int, float]]:
    """Kernels one block launches (after the forward's first, which builds the token table), fused and
    eager, and each one's time in us as a replayed CUDA graph (which computes what the forward did: the
    cache's new rows are rewritten the same)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    meta, num_blocks, block_size, x, positions, cache_init = case
    x = x.bfloat16()
    layer.bind_cache(num_blocks, block_size, torch.bfloat16, "cuda")
    layer.cache_rows.copy_(cache_init.bfloat16())
    report = {}
    for path in ("fused", "eager"):
        if path == "eager":
            monkeypatch.setattr(mla_module, "fusable_rows", lambda x, w: False)
        with torch.no_grad(), forward_context(meta, get_backend("triton")):
            direct = layer(positions, x)  # compiles; builds the token table
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                layer(positions, x)
                torch.cuda.synchronize()
            launches = sum(e.device_type == DeviceType.CUDA for e in prof.events())
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                captured = layer(positions, x)
        graph.replay()
        if path == "fused":  # capturable: the replay computes what the forward did
            assert torch.equal(captured, direct)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(100):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        report[path] = (launches, start.elapsed_time(end) / 100 * 1000)
    return report


def _print_report(what: str, report: dict[str, tuple[int, float]]) -> None:
    print(
        f"\nMLA block {what}: "
        + ", ".join(f"{p} {k} launches {us:.1f} us" for p, (k, us) in report.items())
    )


@pytest.mark.gpu  # kernel launches and time on the GPU
@pytest.mark.parametrize("name", list(GPU_SHAPES))
@pytest.mark.parametrize("layout", ["decode", *LONG_LAYOUTS])
def test_block_launches_and_time(name, layout, monkeypatch):
    """``_launches_and_time`` of the bf16 block; ``pytest -s`` prints them."""
    layer, case = _gpu_case(name, layout)
    report = _launches_and_time(layer, case, monkeypatch)
    _print_report(f"{name} {layout}", report)
    assert report["fused"][0] <= 5


def dequantized_reference(layer: MultiHeadLatentAttention) -> MultiHeadLatentAttention:
    """``layer`` in float32, each quantized projection a plain one holding its dequantized weight."""
    reference = copy.deepcopy(layer)
    for name, child in list(reference.named_children()):
        if is_quantized(child):
            with torch.device(child.scale.device):
                plain = linear(child.in_features, child.out_features)
            plain.weight.data = child.dequantized()
            setattr(reference, name, plain)
    reference.kv_b_dequantized = None
    return reference.float()


@pytest.mark.gpu  # block FP8 at the DeepSeek shapes: GPU only
@pytest.mark.parametrize("name", ["v2-lite", "kimi-k2"])
@pytest.mark.parametrize("layout", ["decode", "chain4", "tree"])
def test_block_fp8_at_the_deepseek_shapes(name, layout, monkeypatch):
    """Every projection in block FP8 (128 x 128), the block in bf16 through the fused kernels, against the
    eager layer in float32 over the dequantized weights."""
    calls = []
    real = mla_fused.mla_forward_fused
    monkeypatch.setattr(mla_fused, "mla_forward_fused", lambda *a: calls.append(1) or real(*a))
    layer, (meta, num_blocks, block_size, x, positions, cache_init) = _gpu_case(name, layout)
    quantize_projections(layer, seed=7)
    x = x.bfloat16()
    out, cache = run(layer, "triton", meta, num_blocks, block_size, x, positions, cache_init)
    assert calls == [1]
    ref_out, ref_cache = run(
        dequantized_reference(layer),
        "torch",
        meta,
        num_blocks,
        block_size,
        x.float(),
        positions,
        cache_init,
    )
    assert _relative(out, ref_out) < 2e-2
    assert _relative(cache, ref_cache) < 1e-2


@pytest.mark.gpu  # kernel launches and time on the GPU
@pytest.mark.parametrize("layout", ["decode", "long_chain4"])
def test_block_fp8_launches_and_time(layout, monkeypatch):
    """DeepSeek-V2-Lite's block in block FP8: five launches fused (o_proj the few-row FP8 kernel's one),
    and the eager chain's count and time beside (``pytest -s`` prints them)."""
    layer, case = _gpu_case("v2-lite", layout)
    report = _launches_and_time(quantize_projections(layer, seed=7), case, monkeypatch)
    _print_report(f"v2-lite block FP8 {layout}", report)
    assert report["fused"][0] <= 5


@pytest.mark.gpu  # the engine's CUDA graphs
# (not "v2-group": its attention has biases, which the fused block declines by design: ``fuses``)
@pytest.mark.parametrize("variant", ["v2-greedy", "v3-yarn"])
def test_the_engine_captures_the_fused_block(variant, tmp_path, monkeypatch):
    """A small DeepSeek target (tests/helpers/deepseek_models.py) in bf16 through the engine: its decode and
    verify graphs (n-gram chains) capture the fused block and serve every request its tokens. (Not
    compared token for token with an eager run: the graphs' padded batches may split the attention
    differently, and in bf16 a greedy choice between close logits may then differ.)"""
    from helpers.deepseek_models import make_hf_deepseek
    from helpers.hf_models import save_hf_model
    from outpace import LLM, SamplingParams
    from outpace.config import SpeculativeConfig

    calls = []  # (the fused residual stack's layers call mla_attend_fused: models/deepseek.py forward_fused)
    real = mla_fused.mla_attend_fused
    monkeypatch.setattr(mla_fused, "mla_attend_fused", lambda *a: calls.append(1) or real(*a))
    path = str(save_hf_model(make_hf_deepseek(variant), tmp_path))
    prompts = [[1, 5, 2, 7, 3], list(range(13)) * 2, [200, 3]]
    greedy = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    kwargs = dict(device="cuda", dtype="bfloat16", max_num_seqs=4, num_kv_blocks=128, block_size=4)
    spec = SpeculativeConfig("ngram", num_steps=3, ngram_min=1)
    outs = LLM(path, speculative=spec, **kwargs).generate(prompts, greedy)
    assert calls
    assert all(len(o.token_ids) == 16 and max(o.token_ids) < 203 for o in outs)  # vocab 203
