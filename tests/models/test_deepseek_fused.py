"""DeepSeek's decoder layers on the fused residual stack (models/deepseek.py ``DeepseekDecoderLayer.forward_fused``
over layers/fused_decoder.py ``run_stack``: MLA's down projections read the stream through the input norm, o_proj
adds the residual and readies the post-attention norm, a MoE block as ``moe_block_fused``, a dense MLP as
``mlp_fused``), forced on with the kernels in Triton's interpreter on the CPU: a random DeepSeek-V2-style checkpoint
(no q_lora_rank, greedy softmax routing) and a V3-style one (q_lora_rank, sigmoid routing with the correction
bias, group-limited top-k), each a dense first layer then MoE layers with shared experts, give the eager path's
logits and latent caches after one decode forward, every layer on the fused path; with the MoE blocks on the
routing and grouped kernels the post-attention norm folds into them (layers/moe.py ``RowNorm``) and no norm
runs as a module."""

import pytest
import torch

pytest.importorskip("triton")

import outpace.cache.kv_cache as kv_cache  # noqa: E402
import outpace.layers.mla as mla_module  # noqa: E402
from helpers.deepseek_models import SMALL, make_hf_deepseek, make_hf_mistral4  # noqa: E402
from helpers.fused_decode import decode_forward, record_fp8_epilogues  # noqa: E402
from helpers.hf_models import save_hf_model  # noqa: E402
from helpers.quantized_checkpoints import (  # noqa: E402
    block_fp8_config,
    is_projection,
    write_mistral4_fp8,
    write_quantized,
)
from outpace.layers import fused_decoder  # noqa: E402
from outpace.layers.mla import MultiHeadLatentAttention  # noqa: E402
from outpace.layers.moe import RoutedExperts  # noqa: E402
from outpace.layers.norm import RMSNorm  # noqa: E402
from outpace.layers.router import RoutingModule  # noqa: E402
from outpace.models.deepseek import DeepseekDecoderLayer  # noqa: E402

if torch.cuda.is_available():  # (the interpreter runs the kernels on CPU tensors only)
    pytest.skip("forces the fused path onto CPU tensors", allow_module_level=True)

# variant -> (tests/helpers/deepseek_models.py variant, overrides, FP8: None, "block" or "mistral4"): the dense
# first layer, then MoE
# layers with a shared expert (n_shared_experts 1: one shared slot of the routed experts' width); in block FP8
# every projection as DeepSeek-V3's checkpoint stores it, the routed and shared experts, the dense MLP and o_proj
# included (their fp8 products finish the residual add and the next norm), in 8 x 64 scale blocks: the grouped
# kernels' (K steps of whole blocks of >= 64 columns, each expert's 24 rows whole blocks), the dense MLP's 84
# rows not (its gate and up do not pack and fold the norm in a launch each, as DeepSeek-V2-Lite's 10944 rows in
# 128-row blocks)
VARIANTS = {
    "v2": ("v2-greedy", dict(q_lora_rank=None), None),
    "v3": ("v3-yarn", {}, None),
    "v3-fp8": ("v3-yarn", dict(intermediate_size=84), "block"),
    # Mistral 4 (helpers/deepseek_models.py MISTRAL4): a softmax router over groups, stacked experts, and the
    # decode's queries at positions 20, 9 and 33 (the first and last scaled) on the absorbed latent and the rotated part
    "mistral4": ("mistral4", {}, None),
    # ... in its FP8 release's layout (helpers/quantized_checkpoints.py write_mistral4_fp8): MLA's per-tensor FP8
    # down projections read by the fused kernels as 128 x 128 blocks of one scale, the fused expert stacks
    "mistral4-fp8": ("mistral4", {}, "mistral4"),
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    cache = {}

    def get(variant):
        if variant not in cache:
            name, overrides, fp8 = VARIANTS[variant]
            path = tmp_path_factory.mktemp(variant)
            make = (
                make_hf_mistral4 if name == "mistral4" else lambda **o: make_hf_deepseek(name, **o)
            )
            cache[variant] = save_hf_model(make(**overrides), path / "bf16")
            if fp8 == "block":
                cache[variant] = write_quantized(
                    cache[variant], path, "fp8_block", is_projection, block_fp8_config((8, 64))
                )[0]
            elif fp8 == "mistral4":
                cache[variant] = write_mistral4_fp8(cache[variant], path)[0]
        return cache[variant]

    return get


def _whole_rows(real_bind):
    """``bind_kv_cache`` handing back each MLA layer's cache as its one tensor of whole rows [blocks,
    block_size, 1, r + rope] (helpers/fused_decode.py stacks a layer's tensors; MLA's two views differ in
    width)."""

    def bind(model, pool, dtype, device):
        real_bind(model, pool, dtype, device)
        layers = [m for m in model.modules() if isinstance(m, MultiHeadLatentAttention)]
        return [(layer.cache_rows,) for layer in layers]

    return bind


def _decode(path, monkeypatch, fused: bool, moe_kernels: bool, norms_run: list | None = None):
    """helpers/fused_decode.py ``decode_forward`` with the fused path forced on or off (MLA's too: layers/mla.py
    reads ``fusable_rows`` as its own name) -> (logits, latent caches). ``moe_kernels``: the MoE blocks route
    and run their experts on the kernels; ``norms_run``: gets each call of a norm over the decode's hidden rows
    (the block norms and the final norm, run as modules)."""
    monkeypatch.setattr(kv_cache, "bind_kv_cache", _whole_rows(kv_cache.bind_kv_cache))
    monkeypatch.setattr(
        mla_module, "fusable_rows", lambda x, w: fused_decoder.fusable_rows(x, w)
    )  # (decode_forward forces fused_decoder's for the decode forward alone)
    monkeypatch.setattr(mla_module.MultiHeadLatentAttention, "fused", True)
    if moe_kernels:
        monkeypatch.setattr(RoutingModule, "kernel", True)
        monkeypatch.setattr(RoutedExperts, "kernels", True)
        # on the decode's 3 rows: the prefill's 62 on the kernels took most of the test's time in the
        # interpreter, and both paths prefill alike (eager), so what is compared is the decode
        for cls, name in ((RoutingModule, "uses_kernel"), (RoutedExperts, "uses_kernels")):
            real_uses = getattr(cls, name)
            monkeypatch.setattr(
                cls, name, lambda self, x, real=real_uses: len(x) == 3 and real(self, x)
            )
    if norms_run is not None:
        real = RMSNorm.forward

        def counted(self, x, residual=None):
            if x.shape == (3, SMALL["hidden_size"]):  # (the decode's hidden-wide norms, not MLA's)
                norms_run.append(1)
            return real(self, x) if residual is None else real(self, x, residual)

        monkeypatch.setattr(RMSNorm, "forward", counted)
    return decode_forward(path, monkeypatch, torch.float32, lambda x, w: fused)


@pytest.mark.parametrize("moe_kernels", [False, True])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_deepseek_layers_fused_compute_the_eager_forward(
    variant, moe_kernels, checkpoints, monkeypatch
):
    path = checkpoints(variant)
    ref_logits, ref_caches = _decode(path, monkeypatch, False, moe_kernels)
    fused_layers = []
    real = DeepseekDecoderLayer.forward_fused

    def counted(self, positions, rows, next_norm):
        fused_layers.append(self.is_moe)
        return real(self, positions, rows, next_norm)

    monkeypatch.setattr(DeepseekDecoderLayer, "forward_fused", counted)
    finished = record_fp8_epilogues(monkeypatch)  # (input norm folded in, next norm readied)
    norms_run = []
    logits, caches = _decode(path, monkeypatch, True, moe_kernels, norms_run)
    # every layer fused: the dense one, then the MoE ones
    assert fused_layers == [False, True, True]
    if VARIANTS[variant][2] == "block":
        # fp8: the dense o_proj readies the post-attention norm, which gate and up fold in, and down_proj the
        # next layer's input norm; a MoE layer's o_proj readies its norm where the block takes the stream so
        assert finished[:4] == [(False, True), (True, False), (True, False), (False, True)], (
            finished
        )
        assert finished[4:] == [(False, moe_kernels)] * 2, finished
    # Folded into the projections: every input norm, the dense layer's post-attention norm, the final norm
    # (the LM head's kernel); a MoE block's too where it routes on the kernels, else it reads its input
    # materialised (one norm launch each)
    assert len(norms_run) == (0 if moe_kernels else 2)
    torch.testing.assert_close(logits, ref_logits, rtol=1e-4, atol=1e-4)
    assert len(caches) == len(ref_caches) == 3
    for c, r in zip(caches, ref_caches):
        torch.testing.assert_close(c, r, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("variant", ["v2", "v3-fp8"])
def test_a_shared_expert_beside_the_experts_reads_the_stream_through_the_norm(
    variant, checkpoints, monkeypatch
):
    """A shared expert that does not fuse with the routed experts (here forced: Kimi-K2-Thinking's bf16 one beside
    its INT4 experts, layers/moe.py ``FusedShared``) runs beside them on the fused stack: it reads the stream made
    ready for the post-attention norm through the norm-folding projections (layers/fused_decoder.py
    ``mlp_normalised``), as the routing and the grouped kernels do, so no norm runs as a module, and the logits
    and latent caches are the eager path's."""
    from outpace.layers import moe as moe_module

    path = checkpoints(variant)
    ref_logits, ref_caches = _decode(path, monkeypatch, False, True)
    monkeypatch.setattr(moe_module.FusedShared, "of", classmethod(lambda cls, mlp, experts: cls()))
    beside = []
    real = fused_decoder.mlp_normalised
    monkeypatch.setattr(fused_decoder, "mlp_normalised", lambda *a: beside.append(1) or real(*a))
    norms_run = []
    logits, caches = _decode(path, monkeypatch, True, True, norms_run)
    assert (
        len(beside) == 2 and len(norms_run) == 0
    )  # (both MoE layers' shared experts; every norm folded)
    torch.testing.assert_close(logits, ref_logits, rtol=1e-4, atol=1e-4)
    for c, r in zip(caches, ref_caches):
        torch.testing.assert_close(c, r, rtol=1e-5, atol=1e-5)
