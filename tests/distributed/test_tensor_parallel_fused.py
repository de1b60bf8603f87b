"""The fused few-row path under tensor parallelism (layers/fused_decoder.py: a row-parallel output projection
ends its block with the plain projection, the all-reduce and the residual add that readies the next norm;
layers/mla_fused.py over a rank's heads, its o_proj reducing itself), on CPU processes (gloo) with the kernels
in Triton's interpreter, forced on for every forward: a random Llama in fp32, its block-FP8 twin, the zoo's
DeepSeek-V3-architecture target (MLA), a random Qwen3-Next (gated DeltaNet, attention, dense and MoE MLPs) and a
random Step-3.5 (head-wise gates, clamped and plain dense MLPs, experts with a shared one: the MoE's partial sums
all-reduced, added and normalised for the next layer) at TP = 2 give the TP = 1 eager path's greedy tokens."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest.importorskip("triton")

from helpers.hybrid_models import make_hybrid, save_hybrid  # noqa: E402
from helpers.quantized_checkpoints import block_fp8_config, is_projection, write_quantized  # noqa: E402
from helpers.spec_models import random_llama  # noqa: E402
from helpers.step3p5_checkpoints import CONFIG as STEP_CONFIG  # noqa: E402
from helpers.step3p5_checkpoints import write_checkpoint as write_step  # noqa: E402
from helpers.tp_harness import Scenario, run_group  # noqa: E402
from outpace import LLM, SamplingParams  # noqa: E402

ZOO = Path(__file__).resolve().parents[2] / "zoo"
# two tokens: the prefill's and one decode step's, each forward on the fused path (every step after the first
# takes the same path again, at a cost of some seconds a step in the interpreter)
GREEDY = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
PROMPTS = [[3, 1, 4, 1, 5], [9, 2, 6, 5, 3, 5, 8]]
TRITON = {"attention_backend": "triton"}  # (the backend whose cache the fused q/k/v kernel writes)
LOG = "OUTPACE_TEST_SHARDED_BLOCK_LOG"  # where each rank notes the sharded block ends it ran fused


def force_fused_path(rank: int, world: int) -> bool:
    """A probe (every rank, before the scenarios): every forward takes the fused path, and each rank notes
    in the file named by ``LOG`` the sharded output projections that ended a block there."""
    import outpace.layers.fused_decoder as fused_decoder
    import outpace.layers.mla as mla
    import outpace.layers.mla_fused as mla_fused
    from outpace.layers.gated_deltanet import GatedDeltaNet
    from outpace.layers.linear import is_sharded
    from outpace.models.qwen3_next import Qwen3NextDecoderLayer
    from outpace.models.step3p5 import Step3p5DecoderLayer

    def note(what: str) -> None:
        with open(os.environ[LOG], "a") as f:
            f.write(f"{what}:{rank}\n")

    end_block, mla_block = fused_decoder.project_add_ready, mla_fused.mla_attend_fused

    def noted_end(x, proj, stream, next_norm):
        if is_sharded(proj):
            note("block")
        return end_block(x, proj, stream, next_norm)

    def noted_mla(attn, *args):
        if is_sharded(attn.o_proj):
            note("mla")
        return mla_block(attn, *args)

    hybrid_layer = Qwen3NextDecoderLayer.forward_fused

    def noted_hybrid(layer, positions, rows, next_norm):
        mixer = layer.linear_attn if layer.is_linear else layer.self_attn
        if is_sharded(mixer.out_proj if layer.is_linear else mixer.o_proj):
            note("hybrid")
        return hybrid_layer(layer, positions, rows, next_norm)

    step_layer = Step3p5DecoderLayer.forward_fused

    def noted_step(layer, positions, rows, next_norm):
        if is_sharded(layer.self_attn.o_proj):
            note("step")
        return step_layer(layer, positions, rows, next_norm)

    fused_decoder.fusable_rows = mla.fusable_rows = lambda x, weight: True
    GatedDeltaNet.fused_step = True  # (the recurrent step kernels, as on the GPU)
    fused_decoder.project_add_ready = noted_end
    mla_fused.mla_attend_fused = noted_mla  # (up to o_proj: MLA's forward and the fused stack's)
    Qwen3NextDecoderLayer.forward_fused = noted_hybrid
    Step3p5DecoderLayer.forward_fused = noted_step
    return True


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("fused_tp")
    src = random_llama(root / "src", vocab_size=50, seed=3, std=0.3)
    # 8-row blocks: a rank's 16 q rows and 8 k/v rows are whole blocks at TP = 2
    quantized, _ = write_quantized(
        src, root / "fp8", "fp8_block", is_projection, block_fp8_config((8, 16))
    )
    hybrid = save_hybrid(make_hybrid("qwen3_next"), root / "qwen3_next")
    (root / "step").mkdir()
    step_config = {  # (a power-of-two head_dim: the fused q/k/v kernel's)
        **STEP_CONFIG,
        "head_dim": 16,
        "attention_other_setting": {**STEP_CONFIG["attention_other_setting"], "head_dim": 16},
    }
    step, _ = write_step(root / "step", step_config, seed=4)
    return {
        "fp32": str(src),
        "fp8": str(quantized),
        "mla": str(ZOO / "tinyds"),
        "hybrid": str(hybrid),
        "step": str(step),
    }


def test_fused_blocks_at_two_ranks_give_one_ranks_tokens(checkpoints, tmp_path, monkeypatch):
    log = tmp_path / "sharded_blocks.log"
    monkeypatch.setenv(LOG, str(log))  # (the spawned ranks inherit it)
    scenarios = [
        Scenario(name, path, PROMPTS, GREEDY, dict(TRITON)) for name, path in checkpoints.items()
    ]
    got = run_group(2, scenarios, tmp_path, probes=[force_fused_path])
    for name, path in checkpoints.items():
        with LLM(path, **TRITON) as llm:
            expected = [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
        assert got[name]["tokens"] == expected, name
    noted = set(Path(log).read_text().split())
    kinds = ("block", "mla", "hybrid", "step")
    assert noted == {f"{what}:{rank}" for what in kinds for rank in (0, 1)}, noted
