"""outpace/bench/widen.py: the zoo target and drafts widened into a bigger shape compute the same
function. Tensor level: one attention layer (plain, and with the DFlash draft's per-head q/k norms) at
the 8B shape on random input, a wrong RoPE pair map caught, an RMSNorm. Engine level (fp32, CPU,
through ``outpace.LLM``): a small but wider shape that exercises every map (hidden 256 -> 576,
head_dim 32 -> 64, kv heads 4 -> 6, q heads per kv head 2 -> 3, so unused q heads sit inside real
groups; 6 -> 8 layers; the standalone draft 192 -> 384, 6/2 -> 12/3 heads) gives the zoo target's
greedy tokens, and every drafter the zoo pair's tokens and acceptance."""

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from outpace import LLM, SamplingParams
from outpace.attention import DenseCausalMetadata, forward_context
from outpace.bench.widen import LLAMA_8B, Shape, Widening, widen_zoo
from outpace.config import SpeculativeConfig
from outpace.layers.decoder import DecoderAttention
from outpace.layers.norm import RMSNorm
from outpace.model_config import ModelConfig
from outpace.models.llama import build_rotary

ZOO = Path(__file__).resolve().parents[2] / "zoo"
SMALL = Shape(hidden=576, layers=8, heads=18, kv_heads=6, head_dim=64, intermediate=1024)
SMALL_DRAFT = Shape(hidden=384, layers=3, heads=12, kv_heads=3, head_dim=64, intermediate=768)
PROMPTS = json.loads((ZOO / "eval_prompts.json").read_text())["prompts"][:3]
GREEDY = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
SPECS = {  # method -> (zoo draft directory name, SpeculativeConfig keyword arguments)
    "eagle3": ("tinypy-eagle3", {"num_steps": 5}),
    "dflash": ("tinypy-dflash", {"num_steps": 7}),
    "mtp": (None, {"num_steps": 3}),
    "draft": ("tinypy-draft", {"num_steps": 5}),
}


def _attention(cfg: dict, tensors: dict[str, torch.Tensor]) -> DecoderAttention:
    mc = ModelConfig.from_dict(cfg)
    attn = DecoderAttention(mc, build_rotary(mc))
    attn.load_state_dict(tensors)
    return attn.eval()


def _attention_pair(src: str, prefix: str, arch: str, big: Shape):
    """(small, widened) attention modules of layer 0 of zoo/<src>, and the small hidden size."""
    cfg = {**json.loads((ZOO / src / "config.json").read_text()), "architectures": [arch]}
    small = Shape.of(cfg)
    w = Widening(small, big, qk_norm=arch == "Qwen3ForCausalLM")
    with safe_open(str(ZOO / src / "model.safetensors"), framework="pt") as f:
        tensors = {
            n.removeprefix(prefix): f.get_tensor(n).float()
            for n in f.keys()
            if n.startswith(prefix)
        }
    widened = {n: w.tensor(prefix + n, t) for n, t in tensors.items()}
    big_cfg = {**w.config(cfg, torch.float32, src), "num_hidden_layers": big.layers}
    return _attention(cfg, tensors), _attention(big_cfg, widened), small.hidden


def _run(attn: DecoderAttention, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    with torch.no_grad(), forward_context(DenseCausalMetadata(1, x.shape[0])):
        return attn(positions, x)


def _check_attention(src, prefix, arch, big):
    """(small output, widened output) of layer 0's attention on random rows, and the small hidden size."""
    small, wide, hs = _attention_pair(src, prefix, arch, big)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(24, hs, generator=g)
    positions = torch.arange(24) * 41 + 5  # up to ~1000: the low frequencies turn too
    xb = torch.zeros(24, big.hidden)
    xb[:, :hs] = x
    out, out_wide = _run(small, x, positions), _run(wide, xb, positions)
    return out, out_wide, hs


@pytest.mark.parametrize(
    "src,prefix,arch",
    [
        ("tinypy", "model.layers.0.self_attn.", "LlamaForCausalLM"),
        (
            "tinypy-dflash",
            "layers.0.self_attn.",
            "Qwen3ForCausalLM",
        ),  # per-head q/k norms: q/k scaled by c = 1/2
    ],
)
@pytest.mark.parametrize("big", [LLAMA_8B, SMALL], ids=["8B", "small"])
def test_attention_layer_widened_same_output(src, prefix, arch, big):
    out, out_wide, hs = _check_attention(src, prefix, arch, big)
    assert out_wide[:, hs:].abs().max() == 0, "padded hidden dims must stay exactly zero"
    torch.testing.assert_close(out_wide[:, :hs], out, atol=1e-5, rtol=1e-5)


def test_wrong_rope_pair_map_is_caught(monkeypatch):
    """Padding each head's dims in place (dim i -> i) pairs i with i + 64 instead of i + 16 at 8B:
    the rotation is wrong and the output differs grossly."""
    monkeypatch.setattr(Widening, "head_dims", lambda self: torch.arange(self.small.head_dim))
    out, out_wide, hs = _check_attention(
        "tinypy", "model.layers.0.self_attn.", "LlamaForCausalLM", LLAMA_8B
    )
    assert (out_wide[:, :hs] - out).abs().max() > 1e-2 * out.abs().max()


def test_rmsnorm_widened_same_output():
    """eps * r and weight * sqrt(r) over zero-padded dims (r = 256 / 4096)."""
    g = torch.Generator().manual_seed(1)
    x, weight = (
        torch.randn(5, 256, generator=g) * 1e-3,
        torch.randn(256, generator=g),
    )  # small x: eps matters
    w = Widening(Shape.of(json.loads((ZOO / "tinypy" / "config.json").read_text())), LLAMA_8B)
    small, big = RMSNorm(256, 1e-5), RMSNorm(4096, 1e-5 * w.ratio)
    small.weight.data, big.weight.data = weight, w.tensor("model.norm.weight", weight)
    xb = torch.zeros(5, 4096)
    xb[:, :256] = x
    out = big(xb)
    assert out[:, 256:].abs().max() == 0
    torch.testing.assert_close(out[:, :256], small(x), atol=1e-6, rtol=1e-6)


def test_impossible_widening_is_refused():
    small = Shape(hidden=256, layers=6, heads=8, kv_heads=4, head_dim=32, intermediate=640)
    with pytest.raises(ValueError, match="head_dim 48"):
        Widening(small, Shape(512, 8, 16, 8, 48, 1024))
    with pytest.raises(ValueError, match="q heads per kv head"):
        Widening(
            small, Shape(512, 8, 8, 8, 64, 1024)
        )  # group 1 < 2: a small group would span two kv heads


# ---- engine level: greedy tokens and acceptance through outpace.LLM --------------------------------


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    # a small shard limit, so the sharded layout with its index is what the engine loads
    return widen_zoo(
        ZOO,
        tmp_path_factory.mktemp("wide"),
        SMALL,
        SMALL_DRAFT,
        torch.float32,
        max_shard_bytes=48 << 20,
    )


def _generate(target: Path, method: str | None = None, draft: Path | None = None):
    spec = {}
    if method:
        spec["speculative"] = SpeculativeConfig(
            method, str(draft) if draft else None, **SPECS[method][1]
        )
    outs = LLM(str(target), device="cpu", dtype="float32", num_kv_blocks=64, **spec).generate(
        PROMPTS, GREEDY
    )
    verifies = sum(o.spec_metrics.num_verifies for o in outs)
    accepted = sum(o.spec_metrics.num_accepted_drafts for o in outs)
    return [o.token_ids for o in outs], (accepted + verifies) / verifies if verifies else None


@pytest.fixture(scope="module")
def reference():
    return _generate(ZOO / "tinypy")[0]


def test_widened_checkpoints_are_shaped(wide):
    cfg = json.loads((wide["tinypy"] / "config.json").read_text())
    assert (
        Shape.of(cfg) == SMALL
        and cfg["rms_norm_eps"] == 1e-5 * (256 / 576)
        and cfg["num_nextn_predict_layers"] == 3
    )
    index = json.loads((wide["tinypy"] / "model.safetensors.index.json").read_text())["weight_map"]
    assert (
        "model.layers.10.eh_proj.weight" in index and "model.layers.7.mlp.down_proj.weight" in index
    )
    assert (
        json.loads((wide["tinypy-dflash"] / "config.json").read_text())["num_target_layers"]
        == SMALL.layers
    )
    assert Shape.of(json.loads((wide["tinypy-draft"] / "config.json").read_text())) == SMALL_DRAFT


def test_widened_target_same_greedy_tokens(wide, reference):
    assert _generate(wide["tinypy"])[0] == reference


@pytest.mark.parametrize("method", list(SPECS))
def test_widened_drafter_same_tokens_and_acceptance(wide, reference, method):
    name = SPECS[method][0]
    tokens, tau = _generate(ZOO / "tinypy", method, name and ZOO / name)
    wide_tokens, wide_tau = _generate(wide["tinypy"], method, name and wide[name])
    assert tokens == reference and wide_tokens == reference
    # The widened drafts compute the zoo drafts' function up to fp32 rounding (reductions over longer,
    # zero-padded rows; the irrational sqrt(256 / 576) and sqrt(2) scales), so they propose the same
    # tokens unless two draft logits are within ~1e-6 of each other. Measured: tau exactly equal for
    # all four drafters. The tolerance (a few accepted drafts over the ~30 verifies) only keeps a
    # near-tie under another BLAS from failing the test; a wrong map drops tau far more (towards 1).
    print(method, tau, wide_tau)
    assert wide_tau == pytest.approx(tau, abs=0.1)
