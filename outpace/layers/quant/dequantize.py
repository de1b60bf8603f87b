"""The math of the three published weight formats, in plain torch, with float32 results.

This file is the definition every other piece agrees with: the CPU path of the quantized layers
dequantizes through it, the GPU kernels are tested against it, and the test-side quantizers below
write the random checkpoints the loading tests read.

Formats (facts checked against the public code cited at each function):
- block FP8 (DeepSeek-V3/R1, Kimi-K2, Qwen3-FP8, Step-3.5-Flash-FP8): ``weight`` float8_e4m3fn
  [N, K] and ``weight_scale_inv`` [ceil(N/bn), ceil(K/bk)]; the real weight is the product of the two,
  each scale covering one bn x bk block (the last blocks may be partial).
- per-tensor FP8 (NVIDIA ModelOpt): ``weight`` float8_e4m3fn and one ``weight_scale``; the real weight
  is their product.
- compressed-tensors pack-quantized INT4 (Kimi-K2-Thinking): ``weight_packed`` int32 [N, K/8], eight
  4-bit values per int32, value j of a word in bits 4j..4j+3 (lowest nibble first), each stored as
  q + 8 (unsigned); ``weight_scale`` [N, K/group]; the real weight is q * scale (symmetric, no zero
  point).
"""

import math

import torch

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8_DTYPE).max  # 448.0
INT4_PACK_FACTOR = 8  # 4-bit values per int32
INT4_OFFSET = 8  # stored nibble = q + 8 (compressed-tensors: offset = 1 << (num_bits - 1))
INT4_MIN, INT4_MAX = -8, 7


def expand_block_scale(
    scale: torch.Tensor, shape: tuple[int, int], block: tuple[int, int]
) -> torch.Tensor:
    """[..., ceil(N/bn), ceil(K/bk)] -> float32 [..., N, K]: each scale repeated over its block."""
    block_n, block_k = block
    n, k = shape
    expected = (math.ceil(n / block_n), math.ceil(k / block_k))
    if tuple(scale.shape[-2:]) != expected:
        raise ValueError(
            f"block scale of shape {tuple(scale.shape)} does not cover a weight of [{n}, {k}] "
            f"in {block_n}x{block_k} blocks (expected [..., {expected[0]}, {expected[1]}])"
        )
    full = scale.float().repeat_interleave(block_n, dim=-2).repeat_interleave(block_k, dim=-1)
    return full[..., :n, :k]


def dequantize_fp8_block(
    weight: torch.Tensor, scale_inv: torch.Tensor, block: tuple[int, int]
) -> torch.Tensor:
    """Block FP8: ``weight`` fp8 [..., N, K] times ``scale_inv`` [..., ceil(N/bn), ceil(K/bk)] -> float32 [..., N, K].

    DeepSeek-V3's inference/kernel.py ``weight_dequant`` computes ``y = x * s`` with s the
    ``weight_scale_inv`` tensor: the checkpoint's name notwithstanding, dequantization multiplies (vLLM's
    fp8_utils and SGLang's fp8 method read it the same way).
    """
    return weight.float() * expand_block_scale(scale_inv, tuple(weight.shape[-2:]), block)


def dequantize_fp8_channel(weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Per-channel FP8 (compressed-tensors' channel strategy): ``weight`` fp8 [N, K] times ``scale`` [N, 1], each
    row by its own (compressed-tensors' dequantize multiplies: x_q * scale)."""
    if scale.shape != (weight.shape[0], 1):
        raise ValueError(
            f"a per-channel weight_scale of a [{weight.shape[0]}, {weight.shape[1]}] weight is "
            f"[{weight.shape[0]}, 1], got {list(scale.shape)}"
        )
    return weight.float() * scale.float()


def dequantize_fp8_tensor(weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Per-tensor FP8: ``weight`` fp8 [..., N, K] times ``scale`` ([] or [1]; [E] for stacked experts [E, N, K]).

    ModelOpt FP8 stores ``weight_scale`` as the multiplier of the fp8 weight (vLLM modelopt.py,
    ``ModelOptFp8LinearMethod``: the GEMM takes ``scale_b=layer.weight_scale``), as AutoFP8 does, and
    transformers' FP8Linear without blocks its ``weight_scale_inv`` (finegrained_fp8.py multiplies by it).
    """
    scale = scale.float()
    if scale.numel() == 1:
        return weight.float() * scale.reshape(())
    if weight.dim() != 3 or scale.shape != (weight.shape[0],):
        raise ValueError(
            f"per-tensor scale of shape {tuple(scale.shape)} fits neither one tensor nor the "
            f"experts of a weight of shape {tuple(weight.shape)}"
        )
    return weight.float() * scale[:, None, None]


def unpack_int4(packed: torch.Tensor, k: int) -> torch.Tensor:
    """compressed-tensors pack-quantized: int32 [..., N, ceil(K/8)] -> int8 [..., N, K] in [-8, 7].

    compressed-tensors' ``pack_to_int32`` (compressors/quantized_compressors/pack_quantized.py) adds
    ``1 << (num_bits - 1)`` = 8 and ORs value i of each group of eight into bits ``4 * i``: lowest
    nibble first. ``unpack_from_int32`` undoes it with ``(value >> 4i) & 0xF`` then ``- 8``.
    """
    if packed.dtype != torch.int32:
        raise ValueError(f"packed INT4 weights must be int32, got {packed.dtype}")
    if packed.shape[-1] != math.ceil(k / INT4_PACK_FACTOR):
        raise ValueError(
            f"packed INT4 weight of shape {tuple(packed.shape)} cannot hold {k} columns"
        )
    shifts = torch.arange(0, 32, 4, device=packed.device, dtype=torch.int32)  # [8]
    nibbles = (packed.unsqueeze(-1) >> shifts) & 0xF  # [..., N, K/8, 8]
    values = nibbles.flatten(-2)[..., :k] - INT4_OFFSET  # [..., N, K]
    return values.to(torch.int8)


def dequantize_int4_group(packed: torch.Tensor, scale: torch.Tensor, group: int) -> torch.Tensor:
    """INT4 groups: ``packed`` int32 [..., N, K/8], ``scale`` [..., N, K/group] -> float32 [..., N, K].

    K is the scale's column count times ``group`` (the published layouts have K a multiple of the
    group). compressed-tensors' ``dequantize`` for the group strategy: ``x_q * scale`` repeated over each
    group of ``group_size`` columns (symmetric: no zero point).
    """
    k = scale.shape[-1] * group
    values = unpack_int4(packed, k).float()  # [..., N, K]
    return values * scale.float().repeat_interleave(group, dim=-1)


# ---- test-side quantizers: write random checkpoints in the published layouts ----


def quantize_fp8_block(
    w: torch.Tensor, block: tuple[int, int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """``w`` [..., N, K] -> (fp8 [..., N, K], float32 scale_inv [..., ceil(N/bn), ceil(K/bk)]): absmax per block / 448."""
    block_n, block_k = block
    n, k = w.shape[-2:]
    rows, cols = math.ceil(n / block_n), math.ceil(k / block_k)
    padded = torch.zeros(
        *w.shape[:-2], rows * block_n, cols * block_k, dtype=torch.float32, device=w.device
    )
    padded[..., :n, :k] = w.float()
    blocks = padded.unflatten(-1, (cols, block_k)).unflatten(
        -3, (rows, block_n)
    )  # [..., R, bn, C, bk]
    absmax = blocks.abs().amax(dim=(-3, -1))  # [..., R, C]
    scale_inv = torch.where(absmax > 0, absmax / FP8_MAX, torch.ones_like(absmax))
    fp8 = (w.float() / expand_block_scale(scale_inv, (n, k), block)).to(FP8_DTYPE)
    return fp8, scale_inv


def quantize_fp8_channel(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``w`` [N, K] -> (fp8, float32 scale [N, 1]): absmax / 448 over each row."""
    absmax = w.float().abs().amax(dim=-1, keepdim=True)
    scale = torch.where(absmax > 0, absmax / FP8_MAX, torch.ones_like(absmax))
    return (w.float() / scale).to(FP8_DTYPE), scale


def quantize_fp8_tensor(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``w`` -> (fp8, float32 scale of shape []): absmax / 448 over the whole tensor."""
    absmax = w.float().abs().amax()
    scale = torch.where(absmax > 0, absmax / FP8_MAX, torch.ones_like(absmax))
    return (w.float() / scale).to(FP8_DTYPE), scale


def quantize_int4_group(w: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``w`` [..., N, K] -> (int32 packed [..., N, K/8], float32 scale [..., N, K/group]): symmetric absmax / 7.

    Packs the way compressed-tensors' ``pack_to_int32`` does (lowest nibble first, stored + 8).
    """
    k = w.shape[-1]
    if k % group or k % INT4_PACK_FACTOR:
        raise ValueError(f"INT4 columns ({k}) must be a multiple of the group ({group}) and of 8")
    groups = w.float().unflatten(-1, (k // group, group))  # [..., N, K/group, group]
    absmax = groups.abs().amax(dim=-1)  # [..., N, K/group]
    scale = torch.where(absmax > 0, absmax / INT4_MAX, torch.ones_like(absmax))
    q = torch.round(groups / scale[..., None]).clamp(INT4_MIN, INT4_MAX).flatten(-2).to(torch.int32)
    nibbles = (q + INT4_OFFSET).unflatten(
        -1, (k // INT4_PACK_FACTOR, INT4_PACK_FACTOR)
    )  # [..., N, K/8, 8]
    shifts = torch.arange(0, 32, 4, device=w.device, dtype=torch.int32)  # [8]
    packed = (nibbles << shifts).sum(dim=-1, dtype=torch.int64)  # [..., N, K/8], < 2**32
    packed = torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)
    return packed, scale
