"""One decode forward of a small checkpoint with the fused few-row path chosen by the test
(layers/fused_decoder.py ``fusable_rows`` replaced), after a prefill through the eager path: what the fused
path tests compare (tests/layers/test_fused_projection*.py)."""

from __future__ import annotations

from pathlib import Path

import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def decode_forward(path: Path, monkeypatch, dtype: torch.dtype, fusable):
    """Prefill three sequences of the checkpoint at ``path`` (a vocabulary of at least 50), then one decode
    forward with ``fusable(x, weight)`` deciding the fused path -> (logits [3, vocab], the KV caches)."""
    import outpace.layers.fused_decoder as fused_decoder
    from outpace.attention import build_paged_metadata, forward_context
    from outpace.attention.triton_backend import TritonAttentionBackend
    from outpace.cache.block_pool import BlockPool
    from outpace.cache.kv_cache import bind_kv_cache
    from outpace.models.loader import load_model

    model = load_model(path, dtype, DEVICE, progress=False)
    backend, tables, prompt_lens = TritonAttentionBackend(), [[3, 1], [0], [5, 2, 4]], [20, 9, 33]
    caches = bind_kv_cache(model, BlockPool(6, 16), dtype, DEVICE)
    prefill = build_paged_metadata(tables, [0, 0, 0], prompt_lens, 16, DEVICE)
    ids = (torch.arange(sum(prompt_lens)) % 50).to(DEVICE)
    positions = torch.cat([torch.arange(n) for n in prompt_lens]).to(DEVICE)
    with torch.inference_mode(), forward_context(prefill, backend):
        model(ids, positions)
    monkeypatch.setattr(fused_decoder, "fusable_rows", fusable)
    decode = build_paged_metadata(tables, prompt_lens, [1, 1, 1], 16, DEVICE)
    with torch.inference_mode(), forward_context(decode, backend):
        out = model(
            torch.tensor([7, 8, 9], device=DEVICE), torch.tensor(prompt_lens, device=DEVICE)
        )
        logits = model.compute_logits(out.hidden_states)
    monkeypatch.undo()
    return logits.float(), [torch.stack(c).float() for c in caches]


def record_fp8_epilogues(monkeypatch) -> list[tuple[bool, bool]]:
    """A spy on the fused stack's fp8 products (layers/fused_projection.py ``_quantized_launch``) until the
    monkeypatch is undone: the list it returns gets, for each product, (the input norm folded in, the next norm
    readied) from its ``RowEpilogue``."""
    from outpace.layers import fused_projection

    finished = []
    real = fused_projection.quant_matmul

    def product(*args, epilogue=None, **kwargs):
        finished.append((epilogue.row_norm is not None, epilogue.next_norm is not None))
        return real(*args, epilogue=epilogue, **kwargs)

    monkeypatch.setattr(fused_projection, "quant_matmul", product)
    return finished


def record_qkv_weights(monkeypatch) -> list:
    """A spy on the fused q/k/v projections (layers/fused_projection.py ``norm_project_qkv``) until the monkeypatch
    is undone: the list it returns gets each call's packed weight (a tensor or an ``Fp8Weight``)."""
    from outpace.layers import fused_projection

    weights = []
    real = fused_projection.norm_project_qkv

    def project(rows, eps, qkv, *args, **kwargs):
        weights.append(qkv)
        return real(rows, eps, qkv, *args, **kwargs)

    monkeypatch.setattr(fused_projection, "norm_project_qkv", project)
    return weights
