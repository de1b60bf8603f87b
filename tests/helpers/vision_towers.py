"""The smallest vision tower of the Qwen-VL family of configs (Qwen2.5-VL, Qwen3-VL, Qwen3.5): the towers a
multimodal checkpoint carries beside its text model, which outpace skips when it serves the text model."""

from __future__ import annotations


def tiny_qwen_vision(out_hidden_size: int, **extra) -> dict:
    """A one-block tower's config whose merged patches come out at the text model's ``out_hidden_size``; extra
    holds the fields one generation adds (deepstack indexes, window size...)."""
    return dict(
        depth=1,
        hidden_size=16,
        intermediate_size=32,
        num_heads=2,
        patch_size=4,
        spatial_merge_size=2,
        temporal_patch_size=2,
        out_hidden_size=out_hidden_size,
        **extra,
    )
