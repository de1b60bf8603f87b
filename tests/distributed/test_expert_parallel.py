"""Expert parallelism end to end, on CPU processes (gloo), in fp32: DeepSeek-V3 and V2 (MLA, grouped routing,
shared experts), Qwen3-Next (gated DeltaNet, a sigmoid-gated shared expert), Step-3.5 (stacked experts with
the SwiGLU clamp, MoE MTP layers; also in Step-3.5-Flash-FP8's block-FP8 stacks), Nemotron-H (ungated relu2
routed experts beside Mamba layers), Gemma 4 (packed gate_up stacks, its MoE block beside every MLP), Qwen3-MoE
(dense layers between), Mixtral (the hub's per-expert names), Qwen3.5-MoE and Qwen2-MoE (a gated shared expert) and Qwen3-VL-MoE (stacked experts in
the hub's transposed order) give
exactly the one-process greedy tokens with their experts placed whole over 2 and 3 ranks, with attention whole
on every rank (TP = 1) and split over the same ranks (EP = TP), with batching, chunked prefill and preemption (a
small pool); speculation under EP (DeepSeek-V3's and Step-3.5's own MoE MTP layers, a DFlash draft over
DeepSeek-V3, an EAGLE3 chain and tree on Qwen3-Next) gives the target's tokens alone and accepts exactly as
many drafts as one process. Quantized experts (DeepSeek-V3's per-expert modules in block FP8 and in INT4,
Step-3.5-Flash-FP8's block-FP8 stacks) give one process's tokens under EP, the stacks holding and reading only
the rank's experts. Sampling stays exact under EP: an EAGLE3 chain on a Qwen3-Next target of 5 tokens at EP = 2
(TP = 1) emits three-token continuations whose counts fit the target's exact joint (chi-square, the TP sampling
test's model, prompt and parameters: tests/helpers/hybrid_sampling.py).

One group of 2 and one of 3 processes (tests/helpers/tp_harness.py) run every scenario (each picks its own
tensor- and expert-parallel sizes); the one-process references run in the test process.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
import torch

from helpers import hybrid_sampling
from helpers.deepseek_models import (
    SPEC_PROMPTS,
    make_hf_deepseek,
    make_hf_mistral4,
    save_v3_with_mtp,
)
from helpers.gemma_models import make_splittable_gemma
from helpers.hf_models import make_hf_model, save_hf_model
from helpers.hybrid_models import make_hybrid, save_hybrid
from helpers.quantized_checkpoints import (
    block_fp8_config,
    int4_config,
    is_projection,
    write_mistral4_fp8,
    write_quantized,
)
from helpers.qwen3_moe_models import make_qwen3_moe, make_qwen3_vl_moe, to_hub_expert_order
from helpers.spec_models import make_dflash_draft, make_eagle3_draft
from helpers.stats import chi_square_p_value, exact_joint
from helpers.step3p5_checkpoints import CONFIG as STEP_CONFIG
from helpers.step3p5_checkpoints import write_checkpoint
from helpers.tp_harness import Scenario, run_group
from outpace import LLM, SamplingParams
from outpace.config import SpeculativeConfig

GREEDY = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
# a small pool and token budget: several requests batched, prompts chunked, requests preempted
PRESSURE = dict(block_size=4, num_kv_blocks=20, max_num_batched_tokens=12)
SPEC_ENGINE = dict(block_size=4, num_kv_blocks=64, max_num_batched_tokens=12)
# 6 heads and every MLP width divisible by 2 and 3; 12 experts in 4 groups (split over 2 and 3 ranks)
DEEPSEEK = dict(
    num_attention_heads=6, num_key_value_heads=6, intermediate_size=96, n_routed_experts=12
)
STEP = {
    **STEP_CONFIG,
    "vocab_size": 13,
    "moe_num_experts": 6,
    "attention_other_setting": {
        **STEP_CONFIG["attention_other_setting"],
        "num_attention_groups": 1,
    },
}
SAMPLING_ENGINE = dict(
    block_size=4, num_kv_blocks=4096, max_num_seqs=1024, max_num_batched_tokens=8192, seed=123
)
VOCAB = 13  # the speculative targets' vocabulary: random drafts are accepted now and then
FP8_BLOCKS = block_fp8_config((4, 8))  # (blocks of 4 x 8 over the tiny shapes)


def prompts() -> list[list[int]]:
    return [
        [(i * 7 + j * 5) % 12 + 1 for j in range(3 + 8 * i)] for i in range(4)
    ]  # (ids of every vocabulary)


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("ep-models")
    sampling = save_hybrid(
        make_hybrid("qwen3_next", vocab_size=hybrid_sampling.VOCAB), root / "qn-sampling"
    )
    spec_qwen = save_hybrid(
        make_hybrid("qwen3_next", vocab_size=VOCAB, num_experts=6), root / "qn-spec"
    )
    step = write_checkpoint(_mkdir(root / "step"), STEP, seed=4)[0]
    v3 = save_hf_model(make_hf_deepseek("v3-yarn", **DEEPSEEK), root / "v3")
    mistral4 = save_hf_model(make_hf_mistral4(**DEEPSEEK), root / "mistral4")
    v3_mtp = save_v3_with_mtp(root / "v3-mtp")[2]  # 8 experts: 2 ranks only
    # Kimi-K2-Thinking's layout: the routed experts' projections INT4 (compressed-tensors), the rest as stored
    int4 = write_quantized(v3, root / "v3-int4", "int4_group", is_expert_projection, int4_config(8))
    return {
        "v3": str(v3),
        "v3-int4": str(int4[0]),
        # DeepSeek-V3's block-FP8 layout: each expert's projections fp8 with their weight_scale_inv
        "v3-fp8": str(
            write_quantized(
                v3, root / "v3-fp8", "fp8_block", is_projection, block_fp8_config((6, 6))
            )[0]
        ),
        "v2": str(save_hf_model(make_hf_deepseek("v2-group", **DEEPSEEK), root / "v2")),
        "qwen3_next": str(save_hybrid(make_hybrid("qwen3_next", num_experts=6), root / "qn")),
        "step": str(step),
        "nemotron_h": str(save_hybrid(make_hybrid("nemotron_h"), root / "nemotron_h")),
        # the latent MoE: each rank's experts' latent sum all-reduced before fc2_latent_proj (weights large
        # enough that the routed sum moves the tokens)
        "nemotron_h-latent": str(
            save_hybrid(
                make_hybrid("nemotron_h", weight_scale=12.0, moe_latent_size=8),
                root / "nemotron_h-latent",
            )
        ),
        "gemma4": str(save_hf_model(make_splittable_gemma("gemma4"), root / "gemma4")),
        "qwen3_moe": str(save_hf_model(make_qwen3_moe("renormalised"), root / "qwen3_moe")),
        "qwen3_5_moe": str(save_hybrid(make_hybrid("qwen3_5_moe"), root / "qwen3_5_moe")),
        # Qwen3-VL-MoE's stacked experts in the hub's (transposed) order: each rank reads its experts' slice
        "qwen3_vl_moe": str(
            to_hub_expert_order(save_hf_model(make_qwen3_vl_moe(), root / "qwen3_vl_moe"))
        ),
        "qwen2_moe": str(save_hf_model(make_hf_model("qwen2-moe"), root / "qwen2_moe")),
        "mixtral": str(save_hf_model(make_hf_model("mixtral"), root / "mixtral")),
        # Mistral 4's stacked experts: each rank reads its experts' slice of the stacks (in FP8 their scales')
        "mistral4": str(mistral4),
        "mistral4-fp8": str(write_mistral4_fp8(mistral4, root / "mistral4-fp8")[0]),
        # Step-3.5-Flash-FP8's layout: block-FP8 expert stacks [E, out, in] with their scale stacks
        "step-fp8": str(
            write_quantized(step, root / "step-fp8", "fp8_block", is_projection, FP8_BLOCKS)[0]
        ),
        "v3-mtp": str(v3_mtp),
        # DFlash over every layer of the DeepSeek-V3 target (its vocabulary's last id the mask)
        "v3-dflash": str(
            make_dflash_draft(
                v3_mtp,
                root / "v3-dflash",
                layer_ids=tuple(range(_layers(v3_mtp))),
                mask_token_id=12,
            )
        ),
        "qwen3_next-spec": str(spec_qwen),
        "eagle3": str(make_eagle3_draft(spec_qwen, root / "eagle3")),
        "sampling": str(sampling),
        "sampling-eagle3": str(make_eagle3_draft(sampling, root / "sampling-eagle3")),
    }


def is_expert_projection(name: str) -> bool:
    return ".experts." in name and is_projection(name)


def _layers(model_dir: Path) -> int:
    return json.loads((model_dir / "config.json").read_text())["num_hidden_layers"]


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def parallel(tp: int, ep: int) -> dict:
    return dict(tensor_parallel_size=tp, expert_parallel_size=ep)


def specs(models) -> dict[str, SpeculativeConfig]:
    return {
        "mtp": SpeculativeConfig("mtp", num_steps=3),
        "eagle3-chain": SpeculativeConfig("eagle3", models["eagle3"], num_steps=3),
        "eagle3-tree": SpeculativeConfig(
            "eagle3", models["eagle3"], num_steps=3, topk=2, num_draft_tokens=6
        ),
        "dflash": SpeculativeConfig("dflash", models["v3-dflash"], num_steps=3),
    }


# name -> (model, TP, EP, speculative method or None) at each group size
PLAIN = {
    2: [
        ("v3", 1, 2),
        ("v3", 2, 2),
        ("v2", 1, 2),
        ("v2", 2, 2),
        ("qwen3_next", 1, 2),
        ("qwen3_next", 2, 2),
        ("step", 1, 2),
        ("step", 2, 2),
        ("nemotron_h", 1, 2),
        ("nemotron_h-latent", 1, 2),
        ("gemma4", 2, 2),
        ("step-fp8", 1, 2),
        ("v3-fp8", 1, 2),
        ("v3-int4", 1, 2),
        ("qwen3_moe", 1, 2),
        ("qwen3_moe", 2, 2),
        ("qwen3_5_moe", 1, 2),
        ("qwen3_vl_moe", 1, 2),
        ("qwen2_moe", 1, 2),
        ("mixtral", 1, 2),
        ("mistral4", 1, 2),
        ("mistral4-fp8", 1, 2),
    ],
    # (TP 3 for DeepSeek-V3 only: the other tiny models' 4 query or 2 key heads do not split over 3 ranks)
    3: [
        ("v3", 1, 3),
        ("v3", 3, 3),
        ("v2", 1, 3),
        ("qwen3_next", 1, 3),
        ("step", 1, 3),
        ("qwen3_moe", 1, 3),
    ],
}
SPECULATIVE = {
    2: [
        ("v3-mtp", 1, 2, "mtp"),
        ("step", 2, 2, "mtp"),
        ("qwen3_next-spec", 1, 2, "eagle3-chain"),
        ("qwen3_next-spec", 2, 2, "eagle3-tree"),
        ("v3-mtp", 1, 2, "dflash"),
    ],
    3: [("step", 1, 3, "mtp")],
}


def plain_name(model: str, tp: int, ep: int) -> str:
    return f"{model}-tp{tp}-ep{ep}"


def spec_name(model: str, tp: int, ep: int, method: str) -> str:
    return f"{model}-{method}-tp{tp}-ep{ep}"


def scenarios(models, size: int) -> list[Scenario]:
    out = [
        Scenario(
            plain_name(m, tp, ep), models[m], prompts(), GREEDY, dict(PRESSURE, **parallel(tp, ep))
        )
        for m, tp, ep in PLAIN[size]
    ]
    out += [
        Scenario(
            spec_name(m, tp, ep, method),
            models[m],
            SPEC_PROMPTS,
            GREEDY,
            dict(SPEC_ENGINE, speculative=specs(models)[method], **parallel(tp, ep)),
        )
        for m, tp, ep, method in SPECULATIVE[size]
    ]
    if size == 2:
        out.append(
            Scenario(
                "sampling",
                models["sampling"],
                [hybrid_sampling.PROMPT] * hybrid_sampling.TRIALS,
                hybrid_sampling.SAMPLED,
                dict(
                    SAMPLING_ENGINE,
                    speculative=SpeculativeConfig("eagle3", models["sampling-eagle3"], num_steps=1),
                    **parallel(1, 2),
                ),
            )
        )
    return out


class HeldExperts:
    """A probe (tests/helpers/tp_harness.py) run on every rank: the group an engine of TP = 1 and EP = world
    joins (distributed/launch.py ``join_group``), and the experts of DeepSeek's first MoE layer its model holds
    there."""

    __name__ = "held_experts"

    def __init__(self, model: str) -> None:
        self.model = model

    def __call__(self, rank: int, world: int) -> list[int]:
        import torch

        from outpace.config import EngineConfig
        from outpace.distributed.group import building_in
        from outpace.distributed.launch import join_group
        from outpace.model_config import ModelConfig
        from outpace.models.loader import build_model

        config = EngineConfig(self.model, tensor_parallel_size=1, expert_parallel_size=world)
        with building_in(join_group(config).group):
            model = build_model(ModelConfig.from_pretrained(self.model), torch.float32, "meta")
        return sorted(
            int(n.split(".")[0]) for n, _ in model.model.layers[1].mlp.experts.named_children()
        )


class HeldQuantizedStacks:
    """A probe run on every rank: the block-FP8 expert stacks (layers/quant/experts.py ``QuantizedStackedWeight``)
    of Step-3.5's first MoE layer as an engine of TP = 1 and EP = world loads them there: their shapes, and
    whether they equal this rank's slice of the checkpoint's stacks (fp8 values and scales, bit for bit)."""

    __name__ = "held_quantized_stacks"

    def __init__(self, model: str) -> None:
        self.model = model

    def __call__(self, rank: int, world: int) -> dict:
        from safetensors import safe_open

        from outpace.config import EngineConfig
        from outpace.distributed.group import building_in
        from outpace.distributed.launch import join_group
        from outpace.layers.quant.experts import QuantizedStackedWeight
        from outpace.models.loader import load_model

        config = EngineConfig(self.model, tensor_parallel_size=1, expert_parallel_size=world)
        with building_in(join_group(config).group):
            model = load_model(self.model, torch.float32, progress=False)
        name, stack = next(
            (n, m) for n, m in model.named_modules() if isinstance(m, QuantizedStackedWeight)
        )
        prefix = model.checkpoint_name(f"{name}.weight").removesuffix(".weight")
        count = stack.weight.shape[0]
        with safe_open(str(Path(self.model) / "model.safetensors"), "pt") as f:
            stored = f.get_tensor(f"{prefix}.weight")[rank * count : (rank + 1) * count]
            scales = f.get_tensor(f"{prefix}.weight_scale_inv")[rank * count : (rank + 1) * count]
        return {
            "weight": list(stack.weight.shape),
            "scale": list(stack.weight_scale_inv.shape),
            "equal": torch.equal(stack.weight.view(torch.uint8), stored.view(torch.uint8))
            and torch.equal(stack.weight_scale_inv, scales),
        }


def run_ep(size: int, models, tmp_path_factory) -> dict:
    probes = [HeldExperts(models["v3"])]
    if size == 2:
        probes.append(HeldQuantizedStacks(models["step-fp8"]))
    return run_group(
        size,
        scenarios(models, size),
        tmp_path_factory.mktemp(f"ep{size}"),
        timeout_s=900,
        probes=probes,
    )


@pytest.fixture(scope="module")
def ep2(models, tmp_path_factory) -> dict:
    return run_ep(2, models, tmp_path_factory)


@pytest.fixture(scope="module")
def ep3(models, tmp_path_factory) -> dict:
    return run_ep(3, models, tmp_path_factory)


@pytest.mark.parametrize("size", [2, 3])
def test_an_engines_group_places_the_experts(size, request):
    """Rank 0 of an engine at TP = 1, EP = size holds experts 0 .. 12 / size - 1 only."""
    assert request.getfixturevalue(f"ep{size}")["held_experts"] == list(range(12 // size))


def test_quantized_expert_stacks_hold_and_read_only_the_ranks_experts(ep2):
    """Step-3.5's 6 block-FP8 experts at EP = 2: rank 0 holds 3 of them, [3, out, in] fp8 with [3, out/4, in/8]
    scales (the stacks' dim-0 shard), equal to the checkpoint's first three."""
    held = ep2["held_quantized_stacks"]
    assert held["weight"][0] == 3 and held["scale"][0] == 3
    assert held["equal"]


@functools.cache
def one_process(path: str, spec: SpeculativeConfig | None, plain: bool) -> tuple:
    """(greedy tokens, drafts accepted) of one process: under PRESSURE (``plain``) or SPEC_ENGINE."""
    engine = dict(PRESSURE) if plain else dict(SPEC_ENGINE)
    if spec is not None:
        engine["speculative"] = spec
    with LLM(path, **engine) as llm:
        outs = llm.generate(prompts() if plain else SPEC_PROMPTS, GREEDY)
    return tuple(o.token_ids for o in outs), sum(o.spec_metrics.num_accepted_drafts for o in outs)


@pytest.mark.parametrize(
    "size, model, tp, ep", [(s, *case) for s, cases in PLAIN.items() for case in cases]
)
def test_greedy_tokens_under_expert_parallelism_equal_one_process(
    size, model, tp, ep, models, request
):
    got = request.getfixturevalue(f"ep{size}")[plain_name(model, tp, ep)]
    assert tuple(got["tokens"]) == one_process(models[model], None, True)[0]
    assert got["preemptions"] > 0, "the pool was meant to force preemption"
    assert got["free_blocks"] == PRESSURE["num_kv_blocks"]


@pytest.mark.parametrize(
    "size, model, tp, ep, method",
    [(s, *case) for s, cases in SPECULATIVE.items() for case in cases],
)
def test_speculation_under_expert_parallelism_is_lossless_with_one_process_acceptance(
    size, model, tp, ep, method, models, request
):
    got = request.getfixturevalue(f"ep{size}")[spec_name(model, tp, ep, method)]
    assert tuple(got["tokens"]) == one_process(models[model], None, False)[0]
    assert got["accepted"] == one_process(models[model], specs(models)[method], False)[1] > 0
    assert got["free_blocks"] == SPEC_ENGINE["num_kv_blocks"]


def test_sampling_under_expert_parallelism_follows_the_target_distribution(ep2, models):
    got, h = ep2["sampling"], hybrid_sampling
    emitted = torch.tensor(got["tokens"])  # [trials, 3]
    assert emitted.shape == (h.TRIALS, 3)
    index = (emitted[:, 0] * h.VOCAB + emitted[:, 1]) * h.VOCAB + emitted[:, 2]
    joint = exact_joint(models["sampling"], h.PROMPT, h.SAMPLED, h.VOCAB)
    p = chi_square_p_value(torch.bincount(index, minlength=h.VOCAB**3), h.TRIALS * joint)
    assert p > 1e-3, f"p = {p:.2e}"
    assert got["accepted"] > 0.1 * h.TRIALS  # speculation really ran
