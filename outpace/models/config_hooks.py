"""How a model family reads its config.json into ``ModelConfig`` (outpace/model_config.py).

``ModelConfig.from_dict`` reads the fields of transformers' common layout (LlamaConfig's names) and
asks the architecture's model class, found through outpace/registry.py, for the rest: each model class
inherits ``ConfigHooks`` and overrides what its family reads otherwise. A new family states its quirks
in its own file; model_config.py does not change.
"""

from __future__ import annotations

from typing import Any, ClassVar

from outpace.validation import ConfigFields

LAYER_TYPES = ("full_attention", "sliding_attention")  # transformers' layer_types of these families


class ConfigHooks:
    """The defaults: transformers' common fields as they are, every layer full attention."""

    # Whether rope_parameters' partial_rotary_factor below 1 (RoPE on the leading part of each head)
    # is implemented; elsewhere it is refused.
    partial_rotary: ClassVar[bool] = False
    # Whether the family reads a top-level partial_rotary_factor itself (transformers 5 moves one into
    # rope_parameters); elsewhere, unless ``partial_rotary``, one other than 1.0 is refused.
    own_partial_rotary_factor: ClassVar[bool] = False
    # Whether rope_parameters' llama_4_scaling_beta (Ministral 3's query temperature by position,
    # ModelConfig.query_scaling) is implemented; elsewhere it is refused.
    query_scaling: ClassVar[bool] = False

    @classmethod
    def config_overrides(cls, cfg: ConfigFields) -> dict[str, Any]:
        """``ModelConfig`` fields this family derives from its config.json (``cfg``, whose typed reads
        name the file and the field in their errors) otherwise than the common layout gives them:
        field name -> value. Fields left out are read the common way."""
        return {}

    @classmethod
    def layer_windows(cls, cfg: ConfigFields, num_layers: int) -> tuple[int | None, ...]:
        """Each of the ``num_layers`` decoder layers' sliding attention window (None: full attention),
        as the family's transformers classes compute it; () when every layer is full."""
        return ()


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
