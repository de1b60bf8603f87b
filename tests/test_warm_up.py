"""The start-up warm-up (engine/warm_up.py): the prefill chunks it runs, and an engine it leaves as it
found it (blocks, slots, drafter and recurrent state), so later requests get the tokens a fresh engine
gives. On the GPU the engine runs it at start-up; here it is called on CPU engines."""
import json
from pathlib import Path

import pytest

from outpace import LLM, SamplingParams
from outpace.config import SpeculativeConfig
from outpace.engine.warm_up import LONGEST_WARM_QUERY, warm_up_prefills

ZOO = Path(__file__).resolve().parents[1] / "zoo"
ENGINE = dict(device="cpu", max_num_seqs=4, max_num_batched_tokens=256, num_kv_blocks=96, block_size=16)


def _engine(target: str, draft: str) -> LLM:
    return LLM(str(ZOO / target), speculative=SpeculativeConfig("eagle3", str(ZOO / draft), num_steps=3), **ENGINE)


@pytest.mark.parametrize("target,draft", [("tinypy", "tinypy-eagle3"), ("tinyqwen35", "tinyqwen35-eagle3")])
def test_warm_up_leaves_the_engine_as_it_found_it(target, draft):
    warmed, fresh = _engine(target, draft), _engine(target, draft)
    engine = warmed.engine
    free_blocks, free_slots = engine.pool.num_free, sorted(engine.runner.slots._free)
    steps, execute = [], engine.runner.execute

    def recording(batch):
        steps.append([s.num_new_tokens for s in batch])
        return execute(batch)

    engine.runner.execute = recording
    warm_up_prefills(engine.runner, engine.pool, 4, 256, engine.max_model_len)
    engine.runner.execute = execute
    # every power-of-two chunk up to the longest tile, alone and as a batch within max_num_seqs and the
    # batched-token budget
    expected = []
    for n in (1 << i for i in range(LONGEST_WARM_QUERY.bit_length())):
        expected += [[n], [n] * min(4, 256 // n)]
    assert steps == expected
    assert engine.pool.num_free == free_blocks and not engine.pool._tables
    assert sorted(engine.runner.slots._free) == free_slots
    prompts = json.loads((ZOO / "eval_prompts.json").read_text())["prompts"][:3]
    for params in (SamplingParams(temperature=0, max_tokens=24, ignore_eos=True),
                   SamplingParams(temperature=0.8, top_p=0.9, max_tokens=24, ignore_eos=True, seed=3)):
        got, want = warmed.generate(prompts, params), fresh.generate(prompts, params)
        assert [o.token_ids for o in got] == [o.token_ids for o in want]
        assert [o.spec_metrics.num_accepted_drafts for o in got] == [o.spec_metrics.num_accepted_drafts for o in want]


def test_warm_up_stops_at_what_the_pool_and_context_hold():
    llm = LLM(str(ZOO / "tinypy"), device="cpu", max_num_seqs=4, max_num_batched_tokens=256, num_kv_blocks=3,
              block_size=16)
    steps, execute = [], llm.engine.runner.execute
    llm.engine.runner.execute = lambda batch: steps.append([s.num_new_tokens for s in batch]) or execute(batch)
    warm_up_prefills(llm.engine.runner, llm.engine.pool, 4, 256, max_len=20)
    # 3 blocks of 16 rows: up to three 16-token chunks at once; the context's 20 rows end the lengths at 16
    assert steps == [[1], [1] * 3, [2], [2] * 3, [4], [4] * 3, [8], [8] * 3, [16], [16] * 3]
    assert llm.engine.pool.num_free == 3
