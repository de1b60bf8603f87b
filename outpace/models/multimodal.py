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


def own_text_name(param_name: str) -> str:
    """A text model's tensor name in a checkpoint that keeps the text model's own names beside its tower
    (Qwen2-VL's and Qwen2.5-VL's hub layout: ``model.layers.0...``, ``lm_head.weight``, ``visual.*``: the source
    patterns of transformers' conversion_mapping for Qwen2VLForConditionalGeneration)."""
    return param_name


def llava_text_name(param_name: str) -> str:
    """A text model's tensor name in a checkpoint of the llava-era layout (Gemma 3, Mistral 3, Kimi-K2.5: the
    source patterns of transformers' conversion_mapping for llava and kimi_k25): every tensor of the text model
    under ``language_model.`` (``language_model.model.layers.0...``, ``language_model.lm_head.weight``)."""
    return f"language_model.{param_name}"


def nested_text_name(param_name: str) -> str:
    """A text model's tensor name in a checkpoint of transformers 5's nested layout (Gemma 4, Qwen3.5,
    Qwen3-VL, as their save_pretrained writes it): the decoder's ``model.X`` as ``model.language_model.X``, the
    head and the rest (MTP layers) at the top level as in the text model's own checkpoint."""
    if param_name.startswith("model."):
        return f"model.language_model.{param_name.removeprefix('model.')}"
    return param_name


class TextOfMultimodal:
    """A text model class (this mixin before it) that loads the text model of a multimodal checkpoint: its
    tensor names through ``text_name`` (``nested_text_name`` or ``llava_text_name``), its ``TOWERS`` (prefixes
    of the checkpoint's non-text tensors) skipped (``skip_towers``)."""

    TOWERS: tuple[str, ...] = ()
    text_name = staticmethod(nested_text_name)

    def __init__(self, cfg: ModelConfig, *args, **kwargs) -> None:
        super().__init__(cfg, *args, **kwargs)
        ignored = tuple(getattr(self, "ignored_checkpoint_tensors", ()))
        self.ignored_checkpoint_tensors = ignored + skip_towers(cfg, self.TOWERS)

    def checkpoint_name(self, param_name: str) -> str:
        inner = getattr(super(), "checkpoint_name", lambda name: name)
        return self.text_name(inner(param_name))
