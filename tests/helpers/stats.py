"""The shared statistical check of the sampling tests: the exact joint distribution of a target's next
three tokens, and a chi-square goodness-of-fit p-value of observed counts against it."""

import torch

from outpace.attention import DenseCausalMetadata, forward_context
from outpace.layers.sampler import SamplingTensors, logits_to_probs
from outpace.models.loader import load_model


def exact_joint(target_dir, prompt: list[int], params, vocab: int) -> torch.Tensor:
    """[vocab ** 3]: the probability of every three-token continuation of ``prompt`` under the target's
    distributions processed by ``params`` (temperature, top-k, top-p...), from outpace's model in fp32 (its
    parity with transformers is each family's own test)."""
    model = load_model(target_dir, torch.float32)
    st = SamplingTensors.from_params([params], "cpu")

    def next_probs(seq: list[int]) -> torch.Tensor:  # [vocab] float64
        with torch.no_grad(), forward_context(DenseCausalMetadata(1, len(seq))):
            h = model(torch.tensor(seq), torch.arange(len(seq))).hidden_states[-1:]
            return logits_to_probs(model.compute_logits(h), st)[0].double()

    return joint_of_three(next_probs, prompt, vocab)


def joint_of_three(next_probs, prompt: list[int], vocab: int) -> torch.Tensor:
    """[vocab ** 3] from ``next_probs(sequence) -> [vocab]`` (the processed next-token distribution);
    branches of probability 0 are not expanded."""
    joint = torch.zeros(vocab, vocab, vocab, dtype=torch.float64)
    p1 = next_probs(prompt)
    for a in p1.nonzero().flatten().tolist():
        p2 = next_probs(prompt + [a])
        for b in p2.nonzero().flatten().tolist():
            joint[a, b] = p1[a] * p2[b] * next_probs(prompt + [a, b])
    return joint.flatten()


def chi_square_p_value(counts: torch.Tensor, expected: torch.Tensor) -> float:
    """P-value of observed ``counts`` against ``expected`` counts (same shape, same total).

    Cells expected under 5 are merged into one; any count in a cell of expectation 0 (a token the
    target can never emit, e.g. one its filters removed) gives p = 0.
    """
    counts, expected = counts.double().flatten(), expected.double().flatten()
    if counts[expected == 0].sum() > 0:
        return 0.0
    big = expected >= 5
    observed_cells, expected_cells = [counts[big]], [expected[big]]
    small = (~big) & (expected > 0)
    if expected[small].sum() >= 1:
        observed_cells.append(counts[small].sum()[None])
        expected_cells.append(expected[small].sum()[None])
    observed, expect = torch.cat(observed_cells), torch.cat(expected_cells)
    stat = ((observed - expect) ** 2 / expect).sum()
    df = observed.numel() - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), stat / 2))
