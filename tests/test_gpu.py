"""GPU-only checks (skipped without CUDA): every zoo drafter stays lossless in fp32 on the GPU."""
import json
from pathlib import Path

import pytest

from outpace import LLM, SamplingParams
from outpace.config import SpeculativeConfig

ZOO = Path(__file__).resolve().parents[1] / "zoo"
SPECS = {
    "eagle3-chain": SpeculativeConfig("eagle3", str(ZOO / "tinypy-eagle3"), num_steps=5),
    "eagle3-tree": SpeculativeConfig("eagle3", str(ZOO / "tinypy-eagle3"), num_steps=5, topk=4, num_draft_tokens=16),
    "mtp": SpeculativeConfig("mtp", num_steps=3),
    "dflash": SpeculativeConfig("dflash", str(ZOO / "tinypy-dflash"), num_steps=7),
    "draft": SpeculativeConfig("draft", str(ZOO / "tinypy-draft"), num_steps=5),
}


@pytest.mark.gpu
@pytest.mark.parametrize("method", list(SPECS))
def test_zoo_drafters_lossless_fp32_on_gpu(method):
    prompts = json.loads((ZOO / "eval_prompts.json").read_text())["prompts"][:8]
    params = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    kwargs = dict(device="cuda", dtype="float32", num_kv_blocks=64, max_num_batched_tokens=128)
    expected = [o.token_ids for o in LLM(str(ZOO / "tinypy"), **kwargs).generate(prompts, params)]
    llm = LLM(str(ZOO / "tinypy"), speculative=SPECS[method], **kwargs)
    outs = llm.generate(prompts, params)
    assert [o.token_ids for o in outs] == expected
    assert llm.engine.pool.num_free == 64
