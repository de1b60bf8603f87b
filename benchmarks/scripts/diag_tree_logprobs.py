"""Is the eagle3-tree run-ahead logprob mismatch nondeterminism or batch dependence? Same engine config twice,
and run-ahead against none, as tests/engine/test_cuda_graphs.py's run-ahead logprob test builds them."""

import sys

sys.path.insert(
    0, "tests"
)  # from the repository root: python3 benchmarks/scripts/diag_tree_logprobs.py
from test_cuda_graphs import _graphed, _prompts  # noqa: E402

from outpace import SamplingParams  # noqa: E402
from outpace.config import SpeculativeConfig  # noqa: E402

spec = SpeculativeConfig(
    method="eagle3", draft="zoo/tinypy-eagle3", num_steps=3, topk=2, num_draft_tokens=6
)
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


def run(run_ahead, penalties=True):
    p = (
        params
        if penalties
        else [q.replace(presence_penalty=0.0, frequency_penalty=0.0) for q in params]
    )
    outs = _graphed(spec, run_ahead=run_ahead, batch_invariant=True).generate(prompts, p)
    return (
        [o.token_ids for o in outs],
        [o.logprobs for o in outs],
        [o.spec_metrics.accepted_per_position for o in outs],
    )


def diff(a, b):
    worst = 0.0
    for x, y in zip(a[1], b[1]):
        for dx, dy in zip(x or [], y or []):
            for t in set(dx) & set(dy):
                worst = max(worst, abs(dx[t].logprob - dy[t].logprob))
    return a[0] == b[0], a[1] == b[1], worst, a[2] == b[2]


for penalties in (True, False):
    no1, no2, ra1, ra2 = (
        run(False, penalties),
        run(False, penalties),
        run(True, penalties),
        run(True, penalties),
    )
    for name, (x, y) in {
        "none/none": (no1, no2),
        "ahead/ahead": (ra1, ra2),
        "ahead/none": (ra1, no1),
    }.items():
        tokens, lps, worst, acc = diff(x, y)
        print(
            f"penalties={penalties} {name}: tokens equal {tokens}, logprobs equal {lps} (max diff {worst:.2e}), "
            f"acceptance equal {acc}"
        )
