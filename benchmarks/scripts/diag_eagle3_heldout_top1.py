"""Teacher-forced step-0 agreement of the zoo EAGLE3 draft with the target on the held-out prompts' greedy
continuations, against serving's first-position acceptance (a train/serve mismatch would show as a gap)."""

import json
import sys

import torch

from outpace import LLM, SamplingParams
from outpace.models.drafts.eagle3 import load_eagle3_draft, target_capture_ids
from outpace.models.loader import load_model
from outpace.train.distill import teacher_forward
from outpace.train.recipes.eagle3 import ttt_forward

draft_dir = (
    sys.argv[1] if len(sys.argv) > 1 else "zoo/tinypy-eagle3"
)  # run from the repository root
prompts = json.load(open("zoo/eval_prompts.json"))["prompts"]
outs = LLM("zoo/tinypy", device="cpu").generate(
    prompts, SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
)
target = load_model("zoo/tinypy", torch.float32, "cpu", progress=False)
draft = load_eagle3_draft(draft_dir, target, torch.float32, "cpu")
target.set_aux_hidden_state_layers(target_capture_ids(draft.config, target))
per_step = {}
with torch.no_grad():
    for o in outs:
        p = len(o.prompt_token_ids)
        tokens = torch.tensor(list(o.prompt_token_ids) + list(o.token_ids))[None]  # [1, T]
        t = tokens.shape[1]
        out = teacher_forward(target, tokens)
        label = target.compute_logits(out.hidden_states).argmax(
            -1
        )  # [T]: the target's choice after row r
        aux = out.aux_hidden_states.view(1, t, -1)
        steps = ttt_forward(draft, draft._embedding, aux, tokens, 3)
        for j, h in enumerate(steps):
            guess = draft.draft_to_target(
                draft.compute_logits(h[0]).argmax(-1)
            )  # row r predicts x_{r+2+j}
            rows = torch.arange(
                max(p - 2, 0), t - 2 - j
            )  # x_{r+1} committed (r + 1 >= p - 1), label in range
            hit = (guess[rows] == label[rows + 1 + j]).float()
            a, n = per_step.get(j, (0.0, 0))
            per_step[j] = (a + hit.sum().item(), n + rows.numel())
for j, (a, n) in per_step.items():
    print(f"teacher-forced step {j}: top-1 agreement {a / n:.3f} over {n} rows")
