"""The text model of a multimodal checkpoint (a ForConditionalGeneration: Gemma 3 and 4, Qwen3.5): outpace serves
the text model and skips the rest of the checkpoint, saying so once in the log."""

from __future__ import annotations

import logging
import re

from outpace.model_config import ModelConfig

logger = logging.getLogger("outpace.models")


def skip_towers(cfg: ModelConfig, prefixes: tuple[str, ...]) -> tuple[str, ...]:
    """A multimodal checkpoint's non-text parts (its tensors under ``prefixes``): logs that they are
    skipped; returns the patterns that make the loader skip them (``ignored_checkpoint_tensors``)."""
    logger.info(
        "%s: outpace serves its text model; the checkpoint's %s are skipped",
        cfg.architecture,
        ", ".join(f"{p}.*" for p in prefixes),
    )
    return tuple(rf"^{re.escape(p)}\." for p in prefixes)
