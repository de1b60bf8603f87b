"""MTP draft layers run their decoder layer as a fused stack of one (layers/fused_decoder.py ``run_layer``): one with
a head of its own (models/drafts/mtp.py ``head_norm``: DeepSeek-V3's layout here) and Qwen3-Next's
(models/drafts/hybrid_mtp.py). With the fused path forced on and its kernels in Triton's interpreter on the CPU,
one decode forward of the MTP layer over three rows takes the layer's ``forward_fused``, its output readied for the
norm that reads it next, and its input (the embedding's gather and the two norms) in one launch, and gives the
eager path's output and cache rows."""

import pytest
import torch

pytest.importorskip("triton")

import outpace.layers.mla as mla_module  # noqa: E402
from helpers.deepseek_models import SMALL, save_v3_with_mtp  # noqa: E402
from helpers.hybrid_drafting import save_with_mtp  # noqa: E402
from outpace.attention import build_paged_metadata, forward_context  # noqa: E402
from outpace.attention.triton_backend import TritonAttentionBackend  # noqa: E402
from outpace.cache.block_pool import BlockPool  # noqa: E402
from outpace.cache.kv_cache import bind_kv_cache  # noqa: E402
from outpace.layers import fused_decoder, normed_rows  # noqa: E402
from outpace.models.deepseek import DeepseekDecoderLayer  # noqa: E402
from outpace.models.drafts import mtp as mtp_module  # noqa: E402
from outpace.models.loader import load_model  # noqa: E402
from outpace.models.qwen3_next import Qwen3NextDecoderLayer  # noqa: E402

if torch.cuda.is_available():  # (the interpreter runs the kernels on CPU tensors only)
    pytest.skip("forces the fused path onto CPU tensors", allow_module_level=True)

TABLES, PROMPT_LENS = [[3, 1], [0], [5, 2, 4]], [20, 9, 33]


def _prefill(mtp, model, hidden_size: int) -> None:
    """The prompt rows of the MTP layer's own cache, eager, from random tokens and states."""
    generator = torch.Generator().manual_seed(0)
    rows = sum(PROMPT_LENS)
    prefill = build_paged_metadata(TABLES, [0, 0, 0], PROMPT_LENS, 16, "cpu")
    positions = torch.cat([torch.arange(n) for n in PROMPT_LENS])
    ids = torch.randint(model.config.vocab_size, (rows,), generator=generator)
    hidden = torch.randn(rows, hidden_size, generator=generator)
    with torch.inference_mode(), forward_context(prefill, TritonAttentionBackend()):
        mtp(positions, ids, hidden, model)


def _mtp_decode(mtp, model, hidden_size: int, fused: bool, monkeypatch) -> torch.Tensor:
    """One forward of the MTP layer over one row a sequence, the fused path forced on or off (its input too:
    models/drafts/mtp.py ``mtp_input``, counted in ``pairs``) -> [3, hidden]."""
    for module in (fused_decoder, mla_module):
        monkeypatch.setattr(module, "fusable_rows", lambda x, w: fused)
    monkeypatch.setattr(mtp_module, "input_pair_fuses", lambda x, table, *norms: fused)
    monkeypatch.setattr(mla_module.MultiHeadLatentAttention, "fused", fused)
    pairs, real = [], normed_rows.embed_norm_pair
    monkeypatch.setattr(normed_rows, "embed_norm_pair", lambda *a: pairs.append(1) or real(*a))
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(model.config.vocab_size, (3,), generator=generator)
    hidden = torch.randn(3, hidden_size, generator=generator)
    decode = build_paged_metadata(TABLES, PROMPT_LENS, [1, 1, 1], 16, "cpu")
    with torch.inference_mode(), forward_context(decode, TritonAttentionBackend()):
        out = mtp(torch.tensor(PROMPT_LENS), ids, hidden, model)
    monkeypatch.undo()
    assert pairs == ([1] if fused else [])  # the input's gather and norms in one launch, fused
    return out


def _counting(monkeypatch, layer_class, calls: list, head_norm) -> None:
    """``layer_class.forward_fused`` recording whether each call readies its output for ``head_norm``."""
    real = layer_class.forward_fused

    def counted(self, positions, rows, next_norm):
        calls.append(next_norm is head_norm)
        return real(self, positions, rows, next_norm)

    monkeypatch.setattr(layer_class, "forward_fused", counted)


def test_mtp_layer_with_its_own_head_runs_as_a_fused_stack(tmp_path, monkeypatch):
    _, _, path = save_v3_with_mtp(tmp_path)
    model = load_model(path, torch.float32, "cpu", progress=False)
    mtp, hidden_size = model.mtp_layers[0], SMALL["hidden_size"]
    bind_kv_cache(model, BlockPool(6, 16), torch.float32, "cpu")
    _prefill(mtp, model, hidden_size)
    ref = _mtp_decode(mtp, model, hidden_size, False, monkeypatch)
    ref_cache = mtp.self_attn.cache_rows.clone()
    calls = []
    _counting(monkeypatch, DeepseekDecoderLayer, calls, mtp.shared_head.norm)
    out = _mtp_decode(mtp, model, hidden_size, True, monkeypatch)
    assert calls == [True]  # the MTP layer's block, its output readied for its own head's norm
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(mtp.self_attn.cache_rows, ref_cache, rtol=1e-5, atol=1e-5)


def test_qwen3_next_mtp_layer_runs_as_a_fused_stack(tmp_path, monkeypatch):
    _, path = save_with_mtp("qwen3_next", tmp_path, 1)
    model = load_model(path, torch.float32, "cpu", progress=False)
    step = model.mtp_layers[0]
    hidden_size = step.fc.weight.shape[0]
    (cache,) = bind_kv_cache(model.mtp_layers, BlockPool(6, 16), torch.float32, "cpu")
    _prefill(step, model, hidden_size)
    ref = _mtp_decode(step, model, hidden_size, False, monkeypatch)
    ref_cache = [c.clone() for c in cache]
    calls = []
    _counting(monkeypatch, Qwen3NextDecoderLayer, calls, step.norm)
    out = _mtp_decode(step, model, hidden_size, True, monkeypatch)
    assert calls == [True]  # the MTP layer, its output readied for the MTP's final norm
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
    for c, r in zip(cache, ref_cache):
        torch.testing.assert_close(c, r, rtol=1e-5, atol=1e-5)
