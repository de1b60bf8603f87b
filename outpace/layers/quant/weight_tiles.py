"""A quantized weight's tiles read in their stored bytes and dequantized in registers (quant/dequantize.py defines
the formats' math): what the quantized product (quant/quant_matmul_kernel.py), the grouped-expert kernels
(layers/moe_kernels.py) and the fused MLA projections (layers/mla_fused.py) stream their weights through.

- ``weight_tile``: a [BN, BK] tile into x's dtype for the tensor cores: block FP8 times its block scales
  (``block_scales`` where a K step spans several scale columns), INT4 nibbles (compressed-tensors pack-quantized:
  eight a word, lowest first, each stored + 8) times their group scales, on a GPU by PTX on value pairs
  (``int4_tile_by_ptx``); "none" the plain load of half-precision weights;
- ``row_times_tile``: one row times a tile on the CUDA cores in float32 (the ONE-ROW path of the few-row product
  and of the grouped experts), INT4 words turned into float32 by integer operations alone (``_int4_row_part``);
- ``scale_rows``: each weight row's scale row.
"""

from __future__ import annotations

import os

import triton
import triton.language as tl

INT4_PACK = 8  # nibbles per int32 word


@triton.jit
def block_scales(
    s_rows,  # [BN, 1] pointers: each row's scale row
    k0,  # the tile's first column (a multiple of BK)
    K,  # the weight's columns
    n_ok,  # [BN] the rows that exist
    stride_sk,  # the scale's column stride
    SCALE_BK: tl.constexpr,  # columns a scale covers
    BK: tl.constexpr,  # a multiple of SCALE_BK
):
    """[BN, BK] float32: the scale of each of the tile's columns, its row's scale column for those
    SCALE_BK columns broadcast over them; zero outside the weight."""
    blocks = k0 // SCALE_BK + tl.arange(0, BK // SCALE_BK)  # [BK / SCALE_BK]
    scale = tl.load(
        s_rows + blocks[None, :] * stride_sk,
        mask=n_ok[:, None] & (blocks < tl.cdiv(K, SCALE_BK))[None, :],
        other=0.0,
    ).to(tl.float32)  # [BN, BK / SCALE_BK]
    return tl.reshape(
        tl.broadcast_to(scale[:, :, None], (scale.shape[0], BK // SCALE_BK, SCALE_BK)),
        (scale.shape[0], BK),
    )


# INT4 nibbles into half precision by PTX (``int4_tile_by_ptx``), and into float32 by one lop3 each on the one-row
# path (``_nibble_times``), on a GPU; Triton's interpreter runs no inline assembly, and OUTPACE_INT4_PTX=0 takes the
# general path (to measure what this gives).
NIBBLES_BY_PTX = tl.constexpr(
    os.environ.get("TRITON_INTERPRET", "0") != "1"
    and os.environ.get("OUTPACE_INT4_PTX", "1") != "0"
)
# A nibble q (0..15, stored + 8) or'd into the mantissa of 128.0 (bf16 0x4300) or 1024.0 (fp16 0x6400) is the
# half-precision number 128 + q or 1024 + q, exactly (bf16 keeps 7 mantissa bits, fp16 10); less 136.0 (0x4308)
# or 1032.0 (0x6408) it is q - 8, exactly. Two nibbles 16 bits apart make a pair (bf16x2 / f16x2) at once:
# (word >> 4 j) & 0x000F000F | magic holds nibbles j and j + 4 (lop3 0xEA: (a & b) | c). Then the pair times the
# scale pair, one rounding each: the bits of round(float32(q - 8) * scale) as the general path computes them.
# (The trick is Marlin's and FasterTransformer's lop3 dequantization, written here for the stored + 8 nibbles.)
_NIBBLE_PTX = """{{
.reg .b32 t0, t1, t2, t3, s2, c, one, z;
mov.b32 s2, {{$9, $9}};
mov.b32 c, {bias};
mov.b32 one, {one};
mov.b32 z, 0x80008000;
shr.u32 t1, $8, 4;
shr.u32 t2, $8, 8;
shr.u32 t3, $8, 12;
lop3.b32 t0, $8, 0x000F000F, {magic}, 0xEA;
lop3.b32 t1, t1, 0x000F000F, {magic}, 0xEA;
lop3.b32 t2, t2, 0x000F000F, {magic}, 0xEA;
lop3.b32 t3, t3, 0x000F000F, {magic}, 0xEA;
fma.rn.{pair} t0, t0, one, c;
fma.rn.{pair} t1, t1, one, c;
fma.rn.{pair} t2, t2, one, c;
fma.rn.{pair} t3, t3, one, c;
fma.rn.{pair} t0, t0, s2, z;
fma.rn.{pair} t1, t1, s2, z;
fma.rn.{pair} t2, t2, s2, z;
fma.rn.{pair} t3, t3, s2, z;
mov.b32 {{$0, $4}}, t0;
mov.b32 {{$1, $5}}, t1;
mov.b32 {{$2, $6}}, t2;
mov.b32 {{$3, $7}}, t3;
}}"""
_BF16_NIBBLES = tl.constexpr(
    _NIBBLE_PTX.format(pair="bf16x2", magic="0x43004300", bias="0xC308C308", one="0x3F803F80")
)
_F16_NIBBLES = tl.constexpr(
    _NIBBLE_PTX.format(pair="f16x2", magic="0x64006400", bias="0xE408E408", one="0x3C003C00")
)
# eight half-precision values out (nibbles 0 .. 7); the word and its scale in
_NIBBLE_OPERANDS = tl.constexpr("=h,=h,=h,=h,=h,=h,=h,=h,r,h")
_EIGHT_BF16 = tl.constexpr((tl.bfloat16,) * 8)
_EIGHT_F16 = tl.constexpr((tl.float16,) * 8)


@triton.jit
def int4_group_scales(
    s_rows,  # [BN, 1] pointers: each row's scales
    k0,  # the tile's first column (a multiple of BK)
    K,  # the weight's columns (unpacked)
    n_ok,  # [BN]
    stride_sk,
    GROUP: tl.constexpr,  # columns a scale covers (a power of two >= 8, dividing BK)
    BK: tl.constexpr,
    K_TILED: tl.constexpr,  # K a multiple of BK: the rows alone masked
):
    """[BN, BK / GROUP] the group scales of an INT4 tile at columns k0 .. k0 + BK - 1, as stored (zero outside the
    weight): what ``int4_tile`` takes. A K loop may load them a step ahead (quant_matmul_kernel.py: at a group of
    BK columns or more they are one 2-byte value a row, which the software pipeline does not stream)."""
    # k0 a multiple of BK, so the first group is a multiple of BK / GROUP, and with K_TILED no mask varies along K:
    # each thread's contiguous scales then load as vectors, which the software pipeline streams (cp.async, of 4
    # bytes or more: 2 or more bf16 scales a row). Masked along K (K // GROUP of unknown divisibility) they came in
    # 2-byte loads that each K step waited on (sm_90 SASS: LDG.E.U16 in the loop).
    groups = tl.multiple_of(k0 // GROUP, BK // GROUP) + tl.arange(0, BK // GROUP)  # [G]
    if K_TILED:
        s_ok = n_ok[:, None]
    else:
        s_ok = n_ok[:, None] & (groups < K // GROUP)[None, :]
    return tl.load(s_rows + groups[None, :] * stride_sk, mask=s_ok, other=0.0)  # [BN, G]


@triton.jit
def int4_tile(
    w_rows,  # [BN, 1] pointers: each packed row's start (int32 words)
    scale,  # [BN, BK / GROUP] the tile's group scales (``int4_group_scales``)
    k0,  # the tile's first column (a multiple of BK)
    K,  # the weight's columns (unpacked)
    n_ok,  # [BN]
    GROUP: tl.constexpr,  # columns a scale covers (a power of two >= 8, dividing BK)
    BK: tl.constexpr,
    DTYPE: tl.constexpr,  # the compute dtype (x's)
    K_TILED: tl.constexpr,  # K a multiple of BK: the rows alone masked
):
    """``weight_tile`` of an INT4 weight, its scales given: [BN, BK] in DTYPE. By PTX (``int4_tile_by_ptx``) for x
    in half precision and scales in x's dtype (other scales would round twice), else each nibble shifted out,
    converted to float32 and scaled. (One expression: a comparison's Python bool assigned to a local becomes a
    tensor, and the branch a runtime one that compiled both returns, fp16 against float32's: gpu_2026-12-06c.)"""
    if (
        NIBBLES_BY_PTX
        and ((DTYPE == tl.bfloat16) or (DTYPE == tl.float16))
        and scale.dtype == DTYPE
    ):
        return int4_tile_by_ptx(w_rows, scale, k0, K, n_ok, GROUP, BK, DTYPE, K_TILED)
    words = k0 // 8 + tl.arange(0, BK // 8)  # [BK / 8]
    packed = tl.load(
        w_rows + words[None, :], mask=n_ok[:, None] & (words < K // 8)[None, :], other=0
    )  # [BN, BK / 8] int32
    packed = tl.interleave(packed, packed)
    packed = tl.interleave(packed, packed)
    packed = tl.interleave(packed, packed)  # [BN, BK]: each word 8 times
    q = ((packed >> ((tl.arange(0, BK) % 8) * 4)[None, :]) & 0xF) - 8  # [BN, BK] in [-8, 7]
    columns = tl.broadcast_to(scale[:, :, None], (scale.shape[0], BK // GROUP, GROUP))
    return (q.to(tl.float32) * tl.reshape(columns, (scale.shape[0], BK)).to(tl.float32)).to(DTYPE)


@triton.jit
def int4_tile_by_ptx(
    w_rows,  # [BN, 1] pointers: each packed row's start (int32 words)
    scale,  # [BN, BK / GROUP] the tile's group scales, in DTYPE
    k0,  # the tile's first column (a multiple of BK)
    K,  # the weight's columns (unpacked)
    n_ok,  # [BN]
    GROUP: tl.constexpr,  # columns a scale covers (a power of two >= 8, dividing BK)
    BK: tl.constexpr,
    DTYPE: tl.constexpr,  # bf16 or fp16
    K_TILED: tl.constexpr,  # K a multiple of BK: the rows alone masked
):
    """``int4_tile`` of an INT4 weight whose scales are in DTYPE, each word's eight nibbles turned into DTYPE
    values by 15 PTX instructions (``_NIBBLE_PTX``, two values an instruction), where the general path shifts,
    masks and converts each value to float32 and back (type conversions issue at a fraction of the rate of
    other arithmetic on the CUDA cores), the same bits."""
    WORDS: tl.constexpr = GROUP // 8
    # k0 a multiple of BK, so the first word is a multiple of BK / 8, and with K_TILED no mask varies along K: each
    # thread's contiguous words then load as vectors, which the software pipeline streams
    words = tl.multiple_of(k0 // 8, BK // 8) + tl.arange(0, BK // 8)  # [BK / 8]
    if K_TILED:
        w_ok = n_ok[:, None]
    else:
        w_ok = n_ok[:, None] & (words < K // 8)[None, :]
    packed = tl.load(w_rows + words[None, :], mask=w_ok, other=0)  # [BN, BK / 8] int32
    packed = tl.reshape(packed, (packed.shape[0], BK // GROUP, WORDS))  # [BN, G, WORDS]
    scale = tl.broadcast_to(scale[:, :, None], packed.shape)
    if DTYPE == tl.bfloat16:
        v0, v1, v2, v3, v4, v5, v6, v7 = tl.inline_asm_elementwise(
            _BF16_NIBBLES,
            _NIBBLE_OPERANDS,
            [packed, scale],
            dtype=_EIGHT_BF16,
            is_pure=True,
            pack=1,
        )  # [BN, G, WORDS] each: nibble j of every word
    else:
        v0, v1, v2, v3, v4, v5, v6, v7 = tl.inline_asm_elementwise(
            _F16_NIBBLES, _NIBBLE_OPERANDS, [packed, scale], dtype=_EIGHT_F16, is_pure=True, pack=1
        )
    # [BN, G, WORDS, 2, 2, 2], element (i, j, l) nibble 4 i + 2 j + l: the columns in order
    tile = tl.join(
        tl.join(tl.join(v0, v4), tl.join(v2, v6)), tl.join(tl.join(v1, v5), tl.join(v3, v7))
    )
    return tl.reshape(tile, (tile.shape[0], BK))


@triton.jit
def weight_tile(
    w_rows,  # [BN, 1] pointers: each weight row's start
    s_rows,  # [BN, 1] pointers: each row's scale row (fp8_block: its block row's; unused otherwise)
    k0,  # the tile's first column (a multiple of BK)
    K,  # the weight's columns (logical, unpacked)
    n_ok,  # [BN] the rows that exist
    stride_sk,  # the scale's column stride
    FORMAT: tl.constexpr,  # "none", "fp8_block", "fp8_tensor" or "int4_group"
    SCALE_BK: tl.constexpr,  # columns a scale covers: bk (fp8_block), the group (int4_group)
    BK: tl.constexpr,  # int4_group: a multiple of SCALE_BK; fp8_block: a divisor or a multiple of it
    DTYPE: tl.constexpr,  # the compute dtype (x's)
    K_TILED: tl.constexpr = False,  # K is a multiple of BK: no tile reaches past the weight's columns
):
    """The real weight values at the tile's rows and columns k0 .. k0 + BK - 1 -> [BN, BK] in DTYPE, zero
    outside the weight ("fp8_tensor": not yet times its scale, which the caller applies)."""
    ks = k0 + tl.arange(0, BK)
    if FORMAT == "int4_group":
        scale = int4_group_scales(s_rows, k0, K, n_ok, stride_sk, SCALE_BK, BK, K_TILED)
        return int4_tile(w_rows, scale, k0, K, n_ok, SCALE_BK, BK, DTYPE, K_TILED)
    w = tl.load(w_rows + ks[None, :], mask=n_ok[:, None] & (ks < K)[None, :], other=0.0)
    if FORMAT == "fp8_block":
        if BK > SCALE_BK:  # several scale columns a step
            scale = block_scales(s_rows, k0, K, n_ok, stride_sk, SCALE_BK, BK)  # [BN, BK]
        else:  # the step lies in one scale column: one scale a row
            scale = tl.load(s_rows + (k0 // SCALE_BK) * stride_sk, mask=n_ok[:, None], other=0.0)
        return (w.to(tl.float32) * scale.to(tl.float32)).to(DTYPE)
    return w.to(DTYPE)


@triton.jit
def row_times_tile(
    acc,  # [BN, GROUPS] float32: the sums so far of each row's groups (summed over groups at the end)
    x_row,  # [1, 1] pointer: the row's column 0
    w_rows,  # [BN, 1] pointers: each weight row's start
    s_rows,  # [BN, 1] pointers: each row's scale row (fp8_block; unused otherwise)
    k0,  # the step's first column (a multiple of GROUPS * GROUP)
    K,  # the weight's columns
    n_ok,  # [BN] the rows that exist
    stride_sk,  # the scale's column stride
    FORMAT: tl.constexpr,  # "none", "fp8_block", "fp8_tensor" (not yet times its scale) or "int4_group"
    SCALE_BK: tl.constexpr,  # columns a scale covers (fp8_block: a multiple of GROUP; int4_group: GROUP)
    GROUPS: tl.constexpr,
    GROUP: tl.constexpr,  # columns a group
):
    """acc + one row of x times the weight's rows at columns k0 .. k0 + GROUPS * GROUP - 1, group by group, on
    the CUDA cores: each weight value converted to float32 once and multiplied by its x value, each group's sum
    (within one scale column) scaled once. The accumulator keeps the groups apart, in the layout their sums come
    in, so that a step converts no layout; ``row_sums`` adds them up after the last step. A one-row product has no use for the tensor cores: a tile of 16 rows (tl.dot's
    fewest) converts every weight value into x's dtype and stages it through shared memory for 15 rows of zeros
    (module docstring: ONE-ROW). INT4 words: ``_int4_row_part``."""
    if FORMAT == "int4_group":
        return acc + _int4_row_part(x_row, w_rows, s_rows, k0, K, n_ok, stride_sk, GROUPS, GROUP)
    ks = (
        k0 + tl.arange(0, GROUPS)[:, None] * GROUP + tl.arange(0, GROUP)[None, :]
    )  # [GROUPS, GROUP]
    in_k = ks < K
    x = tl.load(x_row + ks, mask=in_k, other=0.0).to(tl.float32)  # [GROUPS, GROUP]
    w = tl.load(
        w_rows[:, :, None] + ks[None, :, :],
        mask=n_ok[:, None, None] & in_k[None, :, :],
        other=0.0,
    )  # [BN, GROUPS, GROUP]
    part = tl.sum(w.to(tl.float32) * x[None, :, :], axis=2)  # [BN, GROUPS]
    if FORMAT == "fp8_block":
        columns = (
            k0 + tl.arange(0, GROUPS) * GROUP
        ) // SCALE_BK  # [GROUPS] each group's scale column
        part *= tl.load(
            s_rows + columns[None, :] * stride_sk,
            mask=n_ok[:, None] & (columns < tl.cdiv(K, SCALE_BK))[None, :],
            other=0.0,
        ).to(tl.float32)
    return acc + part


@triton.jit
def _nibble_times(acc, words, high, x, J: tl.constexpr):
    """acc + nibble J of each word (less its stored + 8) times x -> [BN, GROUPS, WORDS] float32: words [BN, GROUPS,
    WORDS] uint32 and ``high`` = words >> 12, x [GROUPS, WORDS] float32 (column 8 w + J of each word w).

    The nibble q in place at bit E of a word (E = 4 J for nibbles 0-4, of ``high`` 4 J - 12 for 5-7: E <= 16), or'd
    into 2^23's bits (0x4B000000), is the float32 2^23 + q 2^E exactly (q 2^E < 2^23); less 2^23 + 8 2^E it is
    (q - 8) 2^E, and times x 2^-E (powers of two: exact) the product (q - 8) x. So a nibble costs one lop3 (and,
    or), a subtraction and an fma, a shift for three of eight, and no conversion instruction (which issue at a
    fraction of the other arithmetic's rate): int4_tile_by_ptx's trick, in float32.

    On the GPU the lop3 is written in PTX with the magic as its third operand: from ``(w & m) | 0x4B000000``
    ptxas made two LOP3s (an SASS LOP3 takes one 32-bit immediate), 520 of the 1268 instructions of a K step of
    Kimi-K2's one-token gate/up loop (BN 8, BK 512, one warp; SASS of the sm_90a build, nvdisasm), against 264 of
    1011 this way: 3.9 instructions a weight rather than 5.0, the same bits (not yet timed on a GPU)."""
    E: tl.constexpr = 4 * J if J < 5 else 4 * J - 12
    source = words if J < 5 else high
    if NIBBLES_BY_PTX:
        bits = tl.inline_asm_elementwise(
            f"lop3.b32 $0, $1, {0xF << E}, 1258291200, 0xEA;",  # (a & b) | c, c = 0x4B000000
            "=r,r",
            [source],
            dtype=tl.uint32,
            is_pure=True,
            pack=1,
        )
    else:
        bits = (source & (0xF << E)) | 0x4B000000
    value = bits.to(tl.float32, bitcast=True) - (8388608.0 + 8.0 * (1 << E))  # (q - 8) 2^E
    return value * (x * (1.0 / (1 << E)))[None, :, :] + acc


@triton.jit
def _int4_row_part(
    x_row,
    w_rows,
    s_rows,  # [BN, 1] pointers: each row's scales (one a group)
    k0,
    K,
    n_ok,
    stride_sk,
    GROUPS: tl.constexpr,
    GROUP: tl.constexpr,  # the scales' group (a power of two >= 8)
):
    """``row_times_tile``'s step over an INT4 weight -> [BN, GROUPS]: each group's sum of (q - 8) x, times its
    scale. The words come 16 bytes at a time into registers, x's columns as [GROUPS, WORDS, 8] split into the
    eight nibble positions (register moves), each nibble turned into float32 in place (``_nibble_times``)."""
    WORDS: tl.constexpr = GROUP // 8
    words = (
        k0 // 8 + tl.arange(0, GROUPS)[:, None] * WORDS + tl.arange(0, WORDS)[None, :]
    )  # [GROUPS, WORDS]
    in_k = words < K // 8
    packed = tl.load(
        w_rows[:, :, None] + words[None, :, :], mask=n_ok[:, None, None] & in_k[None, :, :], other=0
    ).to(tl.uint32, bitcast=True)  # [BN, GROUPS, WORDS] (logical shifts)
    x = tl.load(
        x_row + words[:, :, None] * 8 + tl.arange(0, 8)[None, None, :],
        mask=in_k[:, :, None],
        other=0.0,
    ).to(tl.float32)  # [GROUPS, WORDS, 8]
    # element (i, j, l) of the last three dims is column 4 i + 2 j + l of the word; split off l, then j, then i
    even, odd = tl.split(
        tl.reshape(x, (GROUPS, WORDS, 2, 2, 2))
    )  # l = 0, 1: [GROUPS, WORDS, 2 (i), 2 (j)]
    even_j0, even_j1 = tl.split(even)  # [GROUPS, WORDS, 2 (i)]
    odd_j0, odd_j1 = tl.split(odd)
    x0, x4 = tl.split(even_j0)  # (l = 0, j = 0) i = 0, 1: columns 0 and 4
    x2, x6 = tl.split(even_j1)
    x1, x5 = tl.split(odd_j0)
    x3, x7 = tl.split(odd_j1)
    high = packed >> 12  # (nibbles 5-7 at bits 8, 12, 16)
    part = tl.zeros(packed.shape, tl.float32)
    part = _nibble_times(part, packed, high, x0, 0)
    part = _nibble_times(part, packed, high, x1, 1)
    part = _nibble_times(part, packed, high, x2, 2)
    part = _nibble_times(part, packed, high, x3, 3)
    part = _nibble_times(part, packed, high, x4, 4)
    part = _nibble_times(part, packed, high, x5, 5)
    part = _nibble_times(part, packed, high, x6, 6)
    part = _nibble_times(part, packed, high, x7, 7)
    groups = k0 // GROUP + tl.arange(0, GROUPS)  # [GROUPS]
    scale = tl.load(
        s_rows + groups[None, :] * stride_sk,
        mask=n_ok[:, None] & (groups < K // GROUP)[None, :],
        other=0.0,
    ).to(tl.float32)  # [BN, GROUPS]
    return tl.sum(part, axis=2) * scale


@triton.jit
def row_sums(acc):
    """[BN, GROUPS] -> [1, BN]: ``row_times_tile``'s accumulator summed over its groups."""
    return tl.sum(acc, axis=1)[None, :]


@triton.jit
def scale_rows(s_ptr, rows, stride_sn, FORMAT: tl.constexpr, SCALE_BN: tl.constexpr):
    """[BN, 1] pointers to the scale row of each weight row (``weight_tile``'s ``s_rows``)."""
    if FORMAT == "fp8_block":
        return s_ptr + (rows // SCALE_BN).to(tl.int64)[:, None] * stride_sn
    return s_ptr + rows.to(tl.int64)[:, None] * stride_sn
