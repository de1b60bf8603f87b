"""GPU-only (skipped without CUDA): every MoE family's tiny target runs its decode iteration as captured CUDA
graphs with the grouped-expert kernels inside (layers/moe.py RoutedExperts: nothing in the forward syncs with
the host), and gives in fp32 the tokens of the same engine run eagerly and of the CPU (run_experts); n-gram
speculation stays lossless with graphs. Families and their expert activations: Qwen3-Next (SiLU, a gated
shared expert), Nemotron-H (relu2, ungated), Step-3.5 (SiLU with swiglu_limits clamps, stacked experts),
Gemma 4 (GELU-tanh, packed gate/up), Qwen3-MoE (SiLU, dense layers between), Qwen3.5-MoE (Qwen3-Next's mixture
on Qwen3.5's layers), Mixtral (SiLU, a mixture on every layer). DeepSeek's are
tests/gpu/test_gpu_deepseek.py."""

from __future__ import annotations

import pytest

from outpace import LLM, SamplingParams
from outpace.config import SpeculativeConfig

GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
KWARGS = dict(device="cuda", dtype="float32", max_num_seqs=4, num_kv_blocks=64, block_size=16)
# family -> (vocabulary size, the kernels' activation, the clamp limits its layers use)
FAMILIES = {
    "qwen3_next": (131, "silu", {None}),
    "nemotron_h": (131, "relu2", {None}),
    "nemotron_h-latent": (131, "relu2", {None}),  # the experts in the latent space
    "step3p5": (61, "silu", {None, 0.3}),
    "gemma4": (211, "gelu_tanh", {None}),
    "qwen3_moe": (97, "silu", {None}),
    "qwen3_5_moe": (131, "silu", {None}),
    "mixtral": (203, "silu", {None}),
}


def save_family(family: str, path):
    if family in ("qwen3_next", "nemotron_h", "nemotron_h-latent", "qwen3_5_moe"):
        from helpers.hybrid_models import make_hybrid, save_hybrid

        return save_hybrid(make_hybrid(family), path)
    if family == "step3p5":
        from helpers.step3p5_checkpoints import CONFIG, write_checkpoint

        return write_checkpoint(path, CONFIG)[0]
    from helpers.hf_models import save_hf_model

    if family == "qwen3_moe":
        from helpers.qwen3_moe_models import make_qwen3_moe

        return save_hf_model(make_qwen3_moe("renormalised"), path)
    if family == "mixtral":
        from helpers.hf_models import make_hf_model

        return save_hf_model(make_hf_model("mixtral", head_dim=8), path)
    from helpers.gemma_models import make_gemma

    return save_hf_model(make_gemma("gemma4-moe-kv-shared"), path)


@pytest.fixture(scope="module", params=list(FAMILIES))
def target(request, tmp_path_factory):
    return request.param, str(save_family(request.param, tmp_path_factory.mktemp(request.param)))


def prompts(vocab: int) -> list[list[int]]:
    return [[3, 17, 9, 50, 8, 42, 7], [5, 9], [(i * 7) % vocab for i in range(29)], [vocab - 1, 3]]


def tokens(llm: LLM, vocab: int) -> list[list[int]]:
    return [o.token_ids for o in llm.generate(prompts(vocab), GREEDY)]


@pytest.mark.gpu
def test_captured_decode_equals_eager_and_the_cpu_fp32(target):
    family, path = target
    vocab = FAMILIES[family][0]
    graphed = LLM(path, **KWARGS)
    iteration = graphed.engine.runner.decode_step
    assert iteration.graphs and all(call.graph is not None for call in iteration.graphs.values())
    replays, run = [], iteration.run
    iteration.run = lambda key, *args, **kwargs: (
        replays.append(key in iteration.graphs) or run(key, *args, **kwargs)
    )
    got = tokens(graphed, vocab)
    assert len(replays) > 5 and all(
        replays
    )  # every decode step a replay: nothing in the forward syncs
    assert got == tokens(LLM(path, cuda_graphs=False, **KWARGS), vocab)  # the same kernels, eagerly
    assert got == tokens(LLM(path, device="cpu", block_size=16), vocab)  # run_experts on the CPU


@pytest.mark.gpu
def test_captured_speculation_is_lossless_fp32(target):
    family, path = target
    vocab = FAMILIES[family][0]
    plain = tokens(LLM(path, cuda_graphs=False, **KWARGS), vocab)
    llm = LLM(path, speculative=SpeculativeConfig("ngram", num_steps=3, ngram_min=1), **KWARGS)
    assert all(call.graph is not None for call in llm.engine.runner.decode_step.graphs.values())
    assert tokens(llm, vocab) == plain


@pytest.mark.gpu
def test_moe_layers_take_the_grouped_kernels_with_their_activation(target, monkeypatch):
    import outpace.layers.grouped_experts as launcher  # layers/moe.py imports it at each call

    family, path = target
    vocab, activation, limits = FAMILIES[family]
    calls = []
    real = launcher.grouped_experts
    monkeypatch.setattr(
        launcher,
        "grouped_experts",
        lambda *a, **k: calls.append((k["activation"], k["limit"], a[3] is None)) or real(*a, **k),
    )
    LLM(path, cuda_graphs=False, **KWARGS).generate(
        prompts(vocab)[:1], GREEDY.replace(max_tokens=3)
    )
    assert {c[0] for c in calls} == {activation}
    assert {c[1] for c in calls} == limits
    assert {c[2] for c in calls} == {family.startswith("nemotron_h")}  # ungated: no gate stack


@pytest.mark.gpu
@pytest.mark.parametrize(
    "family",
    [
        "qwen3_next",
        "qwen3_5",
        "qwen3_5_moe",
        "nemotron_h",
        "nemotron_h-latent",
        "step3p5",
        "v2-greedy",
        "v3-yarn",
        "qwen3_moe",
        "mixtral",
        "mistral4",
    ],
)
def test_the_fused_residual_path_gives_the_cpu_tokens_fp32(family, tmp_path, monkeypatch):
    """The few-row layers in the fused residual style (models/qwen3_next.py, models/nemotron_h.py,
    models/step3p5.py, models/deepseek.py, models/qwen3_moe.py over layers/fused_decoder.py ``run_fused_layers``: norms folded into the
    projections), here let take float32 rows (the path serves half precision), captured on the GPU: the CPU's
    greedy tokens. DeepSeek's variants (tests/helpers/deepseek_models.py): V2's MLA without q_lora_rank and
    softmax routing, V3's with one and group-limited sigmoid routing, Mistral 4's softmax group routing, stacked
    experts and query scale by position (its decode past position 16, the scale's first step)."""
    from helpers.fused_rows import take_the_fused_path_in_fp32

    fused = take_the_fused_path_in_fp32(monkeypatch)
    if family == "step3p5":  # (a power-of-two head_dim: the fused q/k/v kernel's)
        from helpers.step3p5_checkpoints import CONFIG, write_checkpoint

        other = {**CONFIG["attention_other_setting"], "head_dim": 16}
        config = {**CONFIG, "head_dim": 16, "attention_other_setting": other}
        path, vocab = str(write_checkpoint(tmp_path, config)[0]), config["vocab_size"]
    elif family in ("qwen3_moe", "mixtral"):
        path, vocab = str(save_family(family, tmp_path)), FAMILIES[family][0]
    elif family.startswith("v") or family == "mistral4":
        from helpers.deepseek_models import make_hf_deepseek, make_hf_mistral4
        from helpers.hf_models import save_hf_model

        overrides = {"q_lora_rank": None} if family == "v2-greedy" else {}
        model = (
            make_hf_mistral4() if family == "mistral4" else make_hf_deepseek(family, **overrides)
        )
        path, vocab = str(save_hf_model(model, tmp_path)), model.config.vocab_size
    else:
        from helpers.hybrid_models import make_hybrid, save_hybrid

        model = make_hybrid(family)
        path, vocab = str(save_hybrid(model, tmp_path)), model.config.vocab_size
    got = tokens(LLM(path, **KWARGS), vocab)
    assert fused  # the decode steps took the fused path
    assert got == tokens(LLM(path, device="cpu", block_size=16), vocab)
