"""Functions that spawned training ranks run by reference (importable in a fresh process)."""

from outpace.train.ranks import TrainRanks


def bars_on_every_rank(steps: int, ranks: TrainRanks) -> int:
    """A progress bar over ``steps`` on every rank, shown on the driver only; -> the number of steps."""
    from tqdm import tqdm

    return sum(1 for _ in tqdm(range(steps), disable=not ranks.is_driver))
