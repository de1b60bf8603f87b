"""The run-ahead logprob test's six cases in one process, in pytest's order (tests/engine/test_cuda_graphs.py::
test_run_ahead_serves_sampled_penalized_and_logprob_steps): for each drafter, the engine without run-ahead
twice (is it deterministic?) and with run-ahead once; where two runs differ, the first differing request
and position with both entries, so a rounding difference and a wrong entry can be told apart."""

import sys

sys.path.insert(
    0, "tests"
)  # from the repository root: python3 benchmarks/scripts/diag_run_ahead_logprobs.py
from test_cuda_graphs import DFLASH, EAGLE3, _graphed, _prompts  # noqa: E402

from outpace import SamplingParams  # noqa: E402
from outpace.config import SpeculativeConfig  # noqa: E402

SPECS = {
    "eagle3": EAGLE3,
    "dflash": DFLASH,
    "eagle3-tree": SpeculativeConfig(
        method="eagle3", draft="zoo/tinypy-eagle3", num_steps=3, topk=2, num_draft_tokens=6
    ),
    "mtp": SpeculativeConfig(method="mtp", num_steps=3),
    "draft": SpeculativeConfig(method="draft", draft="zoo/tinypy-draft", num_steps=4),
    "ngram": SpeculativeConfig(method="ngram", num_steps=4),
}
prompts = _prompts(4)
params = [
    SamplingParams(
        temperature=0.8,
        top_p=0.9,
        seed=i,
        max_tokens=18,
        ignore_eos=True,
        presence_penalty=0.5 * (i % 2),
        frequency_penalty=0.3 * (i % 2),
        logprobs=2 if i % 3 == 0 else None,
    )
    for i in range(4)
]


def run(spec, run_ahead):
    return _graphed(spec, run_ahead=run_ahead, batch_invariant=True).generate(prompts, params)


def first_difference(a, b):
    for r, (x, y) in enumerate(zip(a, b)):
        if x.token_ids != y.token_ids:
            return f"request {r}: tokens differ {x.token_ids} / {y.token_ids}"
        for p, (dx, dy) in enumerate(zip(x.logprobs or [], y.logprobs or [])):
            if dx != dy:
                worst = max(
                    (abs(dx[t].logprob - dy[t].logprob) for t in set(dx) & set(dy)),
                    default=float("nan"),
                )
                return (
                    f"request {r} position {p} (token {x.token_ids[p]}): max diff {worst:.3e}\n"
                    f"    {dict(sorted((t, (round(e.logprob, 6), e.rank)) for t, e in dx.items()))}\n"
                    f"    {dict(sorted((t, (round(e.logprob, 6), e.rank)) for t, e in dy.items()))}"
                )
    return "equal"


for name, spec in SPECS.items():
    none1, none2, ahead = run(spec, False), run(spec, False), run(spec, True)
    print(f"{name}: none/none {first_difference(none1, none2)}", flush=True)
    print(f"{name}: ahead/none {first_difference(ahead, none1)}", flush=True)
