"""The FP8 KV cache's numbers (EngineConfig.kv_cache_dtype): which dtype a name means, and the
per-tensor scale convention every writer and reader of a paged cache follows.

Names, as vLLM's and SGLang's ``--kv-cache-dtype`` spell them: "auto" (the model's dtype), "fp8" and
"fp8_e4m3" (float8_e4m3fn). Other spellings of theirs (fp8_e5m2, fp8_ds_mla, ...) are refused by name.

Scales (vLLM's ``Attention._k_scale`` / ``_v_scale``, vllm/attention/layer.py; SGLang's RadixAttention
``k_scale`` / ``v_scale``): one float32 scalar per layer for k and one for v. A row x is stored as
clamp(x / scale, -448, 448) in float8_e4m3fn (448: e4m3's largest finite value) and read back as
stored * scale. MLA's latent row [c, k_pe] is both key and value, so it is stored and read with the
layer's k scale alone (vLLM's ``concat_and_cache_mla(..., scale=layer._k_scale)``). The scales live on
the attention layer as float32 buffers (1.0 unless the checkpoint has them: cache/kv_scales.py).

Readers: the torch backend dequantizes what it gathers (``dequantize``); the Triton kernels read the
scales through a pointer (no host synchronisation: capturable) and fold them into the arithmetic, the
k scale into the softmax scale (q . (s k) = s (q . k)) and the v scale into the output
(sum p (s v) = s sum p v), so an fp8 element costs one conversion in registers.
"""

from __future__ import annotations

import torch

from outpace.validation import ConfigError

FP8_KV_DTYPE = torch.float8_e4m3fn
FP8_KV_MAX = torch.finfo(FP8_KV_DTYPE).max  # 448.0
KV_CACHE_DTYPES: dict[str, torch.dtype | None] = {
    "auto": None,  # the model's dtype
    "fp8": FP8_KV_DTYPE,
    "fp8_e4m3": FP8_KV_DTYPE,
}


def resolve_kv_cache_dtype(name: str, model_dtype: torch.dtype) -> torch.dtype:
    """The cache dtype ``EngineConfig.kv_cache_dtype`` ``name`` means for a model in ``model_dtype``."""
    if name not in KV_CACHE_DTYPES:
        raise ConfigError(
            f"EngineConfig.kv_cache_dtype={name!r} is invalid: must be one of "
            f"{', '.join(KV_CACHE_DTYPES)}"
        )
    return KV_CACHE_DTYPES[name] or model_dtype


def is_fp8(dtype: torch.dtype) -> bool:
    return dtype == FP8_KV_DTYPE


def unit_scale(device: torch.device | str | None = None) -> torch.Tensor:
    """A scale of 1.0 (float32 scalar): what a layer holds until a checkpoint gives its own."""
    return torch.ones((), dtype=torch.float32, device=device)


def quantize(x: torch.Tensor, scale: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """Rows x (any shape) as a cache of ``dtype`` stores them: clamp(x / scale) to e4m3's range for
    fp8, else x in ``dtype``."""
    if not is_fp8(dtype):
        return x.to(dtype)
    _require_scale(scale)
    return (x.float() / scale).clamp(-FP8_KV_MAX, FP8_KV_MAX).to(dtype)


def dequantize(
    stored: torch.Tensor, scale: torch.Tensor | None, dtype: torch.dtype
) -> torch.Tensor:
    """Cache rows as ``dtype`` values: stored * scale for fp8 (in float32, then ``dtype``)."""
    if not is_fp8(stored.dtype):
        return stored.to(dtype)
    _require_scale(scale)
    return (stored.float() * scale).to(dtype)


def _require_scale(scale: torch.Tensor | None) -> None:
    if scale is None:
        raise ValueError(
            "an FP8 KV cache is written and read with its layer's scale: none was given"
        )


def store(
    cache: torch.Tensor, slots: torch.Tensor, x: torch.Tensor, scale: torch.Tensor | None
) -> None:
    """Write rows x [n, ...] into ``cache`` [num_blocks, block_size, ...] at flat slots [n]
    (block * block_size + offset), quantized as ``quantize`` says."""
    flat = cache.view(-1, *cache.shape[2:])
    rows = quantize(x, scale, cache.dtype)
    # NOTE: torch has no index_copy_ for float8 on the CPU: an fp8 cache is written through its bytes.
    if is_fp8(cache.dtype):
        flat, rows = flat.view(torch.uint8), rows.view(torch.uint8)
    flat.index_copy_(0, slots, rows)
