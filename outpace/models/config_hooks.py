"""How a model family reads its config.json into ``ModelConfig`` (outpace/model_config.py).

``ModelConfig.from_dict`` reads the fields of transformers' common layout (LlamaConfig's names) and
asks the architecture's model class, found through outpace/registry.py, for the rest: each model class
inherits ``ConfigHooks`` and overrides what its family reads otherwise. A new family states its quirks
in its own file; model_config.py does not change.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, ClassVar

from outpace.validation import ConfigFields

LAYER_TYPES = ("full_attention", "sliding_attention")  # transformers' layer_types of these families


class ConfigHooks:
    """The defaults: transformers' common fields as they are, every layer full attention. A model class built from
    a ``ModelConfig`` (``cls(cfg, ...)``, by models/loader.py ``build_model`` or directly) raises the
    ``ConfigError`` of its family's checks with the config.json named (``__init_subclass__``)."""

    # Whether rope_parameters' partial_rotary_factor below 1 (RoPE on the leading part of each head)
    # is implemented; elsewhere it is refused.
    partial_rotary: ClassVar[bool] = False
    # Whether the family reads a top-level partial_rotary_factor itself (transformers 5 moves one into
    # rope_parameters); elsewhere, unless ``partial_rotary``, one other than 1.0 is refused.
    own_partial_rotary_factor: ClassVar[bool] = False
    # Whether rope_parameters' llama_4_scaling_beta (Ministral 3's query temperature by position,
    # ModelConfig.query_scaling) is implemented; elsewhere it is refused.
    query_scaling: ClassVar[bool] = False
    # What the family's transformers config class gives a field that a config.json leaves out, where that differs
    # from what ModelConfig reads then (model_config.py COMMON_FIELDS): field -> value (``config_defaults``). A
    # rope_theta here is the class's ``default_theta``, which a theta in the RoPE parameters overrides.
    class_defaults: ClassVar[dict[str, Any]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # NOTE: each subclass's constructor as resolved (its own, a mixin's before it: models/multimodal.py
        # TextOfMultimodal), wrapped once
        super().__init_subclass__(**kwargs)
        if not getattr(cls.__init__, "names_config_file", False):
            cls.__init__ = _naming_config_file(cls.__init__)

    @classmethod
    def config_overrides(cls, cfg: ConfigFields) -> dict[str, Any]:
        """``ModelConfig`` fields this family derives from its config.json (``cfg``, whose typed reads
        name the file and the field in their errors) otherwise than the common layout gives them:
        field name -> value. Fields left out are read the common way."""
        return {}

    @classmethod
    def config_defaults(cls, cfg: ConfigFields) -> dict[str, Any]:
        """The fields that the config.json (``cfg``) leaves out, with the values the family's transformers config
        class gives them, which ``ModelConfig.from_dict`` reads as if the file gave them: field -> value. The
        default: ``class_defaults``' fields absent from ``cfg`` (a null one is the file's)."""
        return {k: v for k, v in cls.class_defaults.items() if k not in cfg}

    @classmethod
    def layer_windows(cls, cfg: ConfigFields, num_layers: int) -> tuple[int | None, ...]:
        """Each of the ``num_layers`` decoder layers' sliding attention window (None: full attention),
        as the family's transformers classes compute it; () when every layer is full. The default, every
        layer full, refuses a window that the config asks for (``refuse_window``)."""
        refuse_window(cfg, cls.__name__)
        return ()


def _naming_config_file(init: Callable[..., None]) -> Callable[..., None]:
    """``init(self, cfg, ...)`` whose ``ConfigError`` names ``cfg``'s config.json (``ModelConfig.naming_file``)."""

    @functools.wraps(init)
    def init_naming_file(self, cfg, *args, **kwargs) -> None:
        with cfg.naming_file():
            init(self, cfg, *args, **kwargs)

    init_naming_file.names_config_file = True
    return init_naming_file


def refuse_window(cfg: ConfigFields, family: str) -> None:
    """Refuse a ``sliding_window`` on a family whose attention has none (``family`` names it). The config classes of
    such families keep the field as an unknown extra (transformers' LlamaConfig, DeepseekV2Config, DeepseekV3Config,
    Qwen3NextConfig) or declare it (NemotronHConfig), and their models ignore it, yet transformers'
    masking_utils.create_masks_for_generate slides every layer by it, and so does vLLM (config/model.py
    get_hf_config_sliding_window gives it to attention/layer.py Attention as the model-level window): what such a
    checkpoint means is unknown. A null window, or one switched off by ``use_sliding_window: false`` (vLLM's rule
    there), is none: SpecForge's EAGLE3 draft configs (sgl-project/SpecForge configs/qwen2.5-7b-eagle3.json,
    gemma3-1b-eagle3.json), read as Llama's, carry sliding_window 131072 or 512 beside it."""
    if not cfg.boolean("use_sliding_window", True):
        return
    window = cfg.optional_integer("sliding_window", None)
    if window is not None:
        raise cfg.fail(
            "sliding_window",
            window,
            f"null or absent, or use_sliding_window false (sliding-window attention is not "
            f"implemented for {family})",
        )


def windows_of_layer_types(
    cfg: ConfigFields, types: list[str], window: int | None, num_layers: int, sliding_needs: str
) -> tuple[int | None, ...]:
    """transformers' ``layer_types`` -> each layer's window: ``window`` for a sliding_attention layer,
    None for a full_attention one; other types, another count than ``num_layers`` or a sliding layer
    without a window (``sliding_needs`` says what gives one) are refused naming cfg's file."""
    if not (
        len(types) == num_layers
        and set(types) <= set(LAYER_TYPES)
        and (window is not None or "sliding_attention" not in types)
    ):
        raise cfg.fail(
            "layer_types",
            types,
            f"{num_layers} entries of full_attention or sliding_attention (sliding only with "
            f"{sliding_needs})",
        )
    return empty_if_all_full(tuple(window if t == "sliding_attention" else None for t in types))


def empty_if_all_full(windows: tuple[int | None, ...]) -> tuple[int | None, ...]:
    """``windows`` as ``layer_windows`` returns them: () when no layer slides."""
    return windows if any(w is not None for w in windows) else ()
