"""An MTP draft layer with a head of its own (models/drafts/mtp.py ``head_norm``: DeepSeek-V3's layout here) runs its
decoder layer as a fused stack of one (layers/fused_decoder.py ``run_layer``): with the fused path forced on and its
kernels in Triton's interpreter on the CPU, one decode forward of the MTP layer over three rows takes
``DeepseekDecoderLayer.forward_fused`` and gives the eager path's output and latent cache rows."""

import pytest
import torch

pytest.importorskip("triton")

import outpace.layers.mla as mla_module  # noqa: E402
from helpers.deepseek_models import SMALL, save_v3_with_mtp  # noqa: E402
from outpace.attention import build_paged_metadata, forward_context  # noqa: E402
from outpace.attention.triton_backend import TritonAttentionBackend  # noqa: E402
from outpace.cache.block_pool import BlockPool  # noqa: E402
from outpace.cache.kv_cache import bind_kv_cache  # noqa: E402
from outpace.layers import fused_decoder  # noqa: E402
from outpace.models.deepseek import DeepseekDecoderLayer  # noqa: E402
from outpace.models.loader import load_model  # noqa: E402

if torch.cuda.is_available():  # (the interpreter runs the kernels on CPU tensors only)
    pytest.skip("forces the fused path onto CPU tensors", allow_module_level=True)

TABLES, PROMPT_LENS = [[3, 1], [0], [5, 2, 4]], [20, 9, 33]


def _mtp_decode(mtp, fused: bool, monkeypatch) -> torch.Tensor:
    """One forward of the MTP layer over one row a sequence, the fused path forced on or off -> [3, hidden]."""
    monkeypatch.setattr(fused_decoder, "fusable_rows", lambda x, w: fused)
    monkeypatch.setattr(mla_module, "fusable_rows", lambda x, w: fused)
    monkeypatch.setattr(mla_module.MultiHeadLatentAttention, "fused", fused)
    generator = torch.Generator().manual_seed(1)
    embeds, hidden = (torch.randn(3, SMALL["hidden_size"], generator=generator) for _ in range(2))
    decode = build_paged_metadata(TABLES, PROMPT_LENS, [1, 1, 1], 16, "cpu")
    with torch.inference_mode(), forward_context(decode, TritonAttentionBackend()):
        out = mtp(torch.tensor(PROMPT_LENS), embeds, hidden)
    monkeypatch.undo()
    return out


def test_mtp_layer_with_its_own_head_runs_as_a_fused_stack(tmp_path, monkeypatch):
    _, _, path = save_v3_with_mtp(tmp_path)
    model = load_model(path, torch.float32, "cpu", progress=False)
    mtp = model.mtp_layers[0]
    bind_kv_cache(model, BlockPool(6, 16), torch.float32, "cpu")
    generator = torch.Generator().manual_seed(0)
    rows = sum(PROMPT_LENS)
    prefill = build_paged_metadata(TABLES, [0, 0, 0], PROMPT_LENS, 16, "cpu")
    positions = torch.cat([torch.arange(n) for n in PROMPT_LENS])
    embeds, hidden = (torch.randn(rows, SMALL["hidden_size"], generator=generator) for _ in range(2))
    with torch.inference_mode(), forward_context(prefill, TritonAttentionBackend()):
        mtp(positions, embeds, hidden)  # the prompt rows of the MTP layer's own latent cache, eager

    ref = _mtp_decode(mtp, False, monkeypatch)
    ref_cache = mtp.self_attn.cache_rows.clone()
    fused_calls = []
    real = DeepseekDecoderLayer.forward_fused

    def counted(self, positions, rows, next_norm):
        fused_calls.append(next_norm is mtp.shared_head.norm)
        return real(self, positions, rows, next_norm)

    monkeypatch.setattr(DeepseekDecoderLayer, "forward_fused", counted)
    out = _mtp_decode(mtp, True, monkeypatch)
    assert fused_calls == [True]  # the MTP layer's block, its output readied for its own head's norm
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(mtp.self_attn.cache_rows, ref_cache, rtol=1e-5, atol=1e-5)
