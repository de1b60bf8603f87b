"""A block-FP8 DeepSeek-V3-style checkpoint (tests/helpers/quantized_checkpoints.py: every decoder projection
fp8 with its weight_scale_inv, routers, norms, embedding and head as stored) loaded at tensor_parallel_size=2
on CPU processes (gloo, tests/helpers/tp_harness.py): each rank reads its rows or columns of every quantized
weight and the scales of the blocks they lie in (layers/quant/linear.py ``scale_shard``), and the group gives
one process's greedy tokens under batching, chunked prefill and preemption. So does a per-tensor FP8 Ministral 3 (Mistral's
FP8 layout: one scale a weight, which every rank holds whole), a per-channel FP8 Llama (compressed-tensors), and
Mistral 4 with fused FP8 expert stacks (one scale an expert: each rank its rows of every expert)."""

from __future__ import annotations

import pytest

from helpers.deepseek_models import make_hf_deepseek
from helpers.hf_models import save_hf_model
from helpers.quantized_checkpoints import block_fp8_config, is_projection, write_quantized
from helpers.tp_harness import Scenario, run_group
from outpace import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
# a small pool and token budget: several requests batched, prompts chunked, requests preempted
PRESSURE = dict(block_size=4, num_kv_blocks=20, max_num_batched_tokens=16)
# 6 heads, dense MLP 96, experts and shared expert 24: every split at TP = 2 (o_proj's 30 columns, an
# expert's 12 rows, kv_b's 66 rows, ...) whole 6 x 6 blocks, so no rank shares a scale with the other
DEEPSEEK = dict(num_attention_heads=6, num_key_value_heads=6, intermediate_size=96)
BLOCK = (6, 6)


def prompts() -> list[list[int]]:
    return [[(i * 37 + j * 11) % 199 + 1 for j in range(3 + 7 * i)] for i in range(4)]


@pytest.fixture(scope="module")
def fp8_deepseek(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("fp8-deepseek")
    source = save_hf_model(make_hf_deepseek("v3-yarn", **DEEPSEEK), root / "source")
    quantized, _ = write_quantized(
        source, root, "fp8_block", is_projection, block_fp8_config(BLOCK)
    )
    return str(quantized)


@pytest.fixture(scope="module")
def per_tensor_ministral(tmp_path_factory) -> str:
    from helpers.hf_models import make_hf_model
    from helpers.quantized_checkpoints import per_tensor_fp8_config

    root = tmp_path_factory.mktemp("fp8-ministral")
    model = make_hf_model("ministral3", num_attention_heads=6, num_key_value_heads=6)
    config = per_tensor_fp8_config("static", ["lm_head"])
    names = ("weight_scale_inv", "activation_scale")
    source = save_hf_model(model, root / "source")
    return str(
        write_quantized(source, root, "fp8_tensor", is_projection, config, tensor_names=names)[0]
    )


@pytest.fixture(scope="module")
def fused_fp8_mistral4(tmp_path_factory) -> str:
    """Mistral 4 as its FP8 release is reported to store it: per-tensor projections and fused FP8 expert
    stacks with one scale an expert, each rank their rows, every scale whole."""
    from helpers.deepseek_models import make_hf_mistral4
    from helpers.quantized_checkpoints import write_mistral4_fp8

    root = tmp_path_factory.mktemp("fp8-mistral4")
    source = save_hf_model(make_hf_mistral4(**DEEPSEEK), root / "source")
    return str(write_mistral4_fp8(source, root)[0])


@pytest.fixture(scope="module")
def per_channel_llama(tmp_path_factory) -> str:
    """compressed-tensors' per-channel FP8: a column-parallel projection's rank holds its rows' scales, a
    row-parallel one every scale."""
    from helpers.hf_models import make_hf_model
    from helpers.quantized_checkpoints import float_quantized_config

    root = tmp_path_factory.mktemp("fp8-llama")
    model = make_hf_model("llama", num_attention_heads=6, num_key_value_heads=6)
    source = save_hf_model(model, root / "source")
    config = float_quantized_config("channel")
    return str(write_quantized(source, root, "fp8_channel", is_projection, config)[0])


@pytest.mark.parametrize(
    "checkpoint",
    ["fp8_deepseek", "per_tensor_ministral", "per_channel_llama", "fused_fp8_mistral4"],
)
def test_fp8_at_two_ranks_gives_one_process_tokens(checkpoint, tmp_path, request):
    path = request.getfixturevalue(checkpoint)
    got = run_group(2, [Scenario("fp8", path, prompts(), GREEDY, PRESSURE)], tmp_path)
    with LLM(path, **PRESSURE) as llm:
        expected = [o.token_ids for o in llm.generate(prompts(), GREEDY)]
    assert got["fp8"]["tokens"] == expected
    assert got["fp8"]["preemptions"] > 0
