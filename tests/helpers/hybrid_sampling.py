"""The hybrid sampling tests' request: a Qwen3-Next target of 5 tokens (so that the joint of three tokens
stays small enough to test), its prompt and sampling parameters."""

from outpace import SamplingParams

VOCAB, PROMPT, LENGTH, TRIALS = 5, [0, 1, 2, 3, 4, 1], 3, 3000
SAMPLED = SamplingParams(temperature=0.9, max_tokens=LENGTH, ignore_eos=True)
