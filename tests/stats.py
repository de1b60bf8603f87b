"""The shared statistical check: a chi-square goodness-of-fit p-value."""
import torch


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
