"""Whether hybrid prefix caching (recurrent-state checkpoints: a prompt's prefill cut at block boundaries) is
what makes MTP's log-probabilities differ from plain decoding's in the batch-invariant mode on the GPU
(tests/gpu/test_batch_invariant_hybrids_gpu.py failed at gpu_2026-12-07b call 1): the test's run, prefix
caching on and off.

    PYTHONPATH=. python3 benchmarks/scripts/diag_hybrid_mtp_bits_prefix.py
"""

import json
from pathlib import Path

from outpace import LLM, SamplingParams
from outpace.config import SpeculativeConfig

ZOO = Path(__file__).resolve().parents[2] / "zoo"


def run(spec: SpeculativeConfig, caching: bool) -> tuple[list, list]:
    prompts = json.loads((ZOO / "eval_prompts.json").read_text())["prompts"][:4]
    llm = LLM(
        str(ZOO / "tinyqwen35"),
        speculative=spec,
        device="cuda",
        dtype="bfloat16",
        batch_invariant=True,
        max_num_seqs=1,
        num_kv_blocks=256,
        enable_prefix_caching=caching,
    )
    params = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True, logprobs=2)
    outs = llm.generate(prompts, params)
    logprobs = [[{t: lp.logprob for t, lp in pos.items()} for pos in o.logprobs] for o in outs]
    return [o.token_ids for o in outs], logprobs


for caching in (True, False):
    plain = run(SpeculativeConfig(), caching)
    mtp = run(SpeculativeConfig("mtp", num_steps=2), caching)
    same = [p == m for p, m in zip(plain[1], mtp[1])]
    print(
        f"prefix caching {caching}: tokens equal {plain[0] == mtp[0]}, logprobs equal per prompt {same}"
    )
