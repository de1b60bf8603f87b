"""Every rank of an engine started with the same configuration, checked once when the ranks meet.

Processes that torchrun starts on several machines each parse their own flags: a rank given another
``--max-num-seqs``, another checkpoint or another outpace would schedule other batches or build other
shards, and fail later in a collective with an error that names nothing. So before any model is built
every rank gathers every other rank's summary of its configuration (the EngineConfig fields, the model's
config.json digest, the outpace and torch versions) over the CPU group, and each one raises the same
``ConfigMismatch`` naming the ranks and fields that differ from rank 0's: all ranks stop, none hangs.
"""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

import torch
import torch.distributed as dist

from outpace.distributed.group import RankGroup


class ConfigMismatch(ValueError):
    """The ranks of one engine were started with different configurations or versions."""


def config_summary(config) -> dict[str, str]:
    """field -> value (repr) of an EngineConfig, with the versions and the model's config.json digest."""
    import outpace

    summary = {
        f"EngineConfig.{f.name}": repr(getattr(config, f.name)) for f in dataclasses.fields(config)
    }
    summary["outpace version"] = outpace.__version__
    summary["torch version"] = torch.__version__
    model_json = Path(config.model) / "config.json"
    if model_json.is_file():
        summary[f"{model_json} (sha256)"] = hashlib.sha256(model_json.read_bytes()).hexdigest()
    return summary


def mismatches(summaries: list[dict[str, str]]) -> list[str]:
    """Each rank's differences from rank 0's summary, in words (empty when all agree)."""
    driver, found = summaries[0], []
    for rank, theirs in enumerate(summaries[1:], start=1):
        differing = [
            k for k in sorted(driver.keys() | theirs.keys()) if driver.get(k) != theirs.get(k)
        ]
        found += [f"rank {rank} {k}={theirs.get(k)} (rank 0: {driver.get(k)})" for k in differing]
    return found


def agree_on_config(config, group: RankGroup) -> None:
    """Raise ``ConfigMismatch`` on every rank unless every rank's ``config_summary`` equals rank 0's (a
    collective over the group's CPU group: every rank calls it once, before building its engine)."""
    if group.size == 1:
        return
    summaries: list = [None] * group.size
    dist.all_gather_object(summaries, config_summary(config), group=group.cpu_group)
    found = mismatches(summaries)
    if found:
        more = f" and {len(found) - 8} more" if len(found) > 8 else ""
        raise ConfigMismatch(
            "the ranks of one engine were started differently: " + "; ".join(found[:8]) + more
        )
