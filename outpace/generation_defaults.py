"""The sampling defaults of a model's generation_config.json: what a request that leaves a field unset gets, as
vLLM (its default ``--generation-config auto``) and SGLang (its default ``--sampling-defaults model``, the same keys
but max_new_tokens: python/sglang/srt/configs/model_config.py ``get_default_sampling_params``) give it.

vLLM keeps six keys of the file (vllm/config/model.py ``ModelConfig.get_diff_sampling_param``): repetition_penalty,
temperature, top_k, top_p, min_p, and max_new_tokens as the default max_tokens. ``do_sample`` is not among them: a
file with ``do_sample: false`` and ``temperature: 0.6`` samples at 0.6 in vLLM, and here. ``--generation-config
vllm`` ignores the file, ``--generation-config DIR`` reads DIR/generation_config.json instead, and
``--override-generation-config JSON`` sets keys over either (the same method: ``config.update(override)``). The
OpenAI server gives them to every field a request leaves unset, the request's own value winning
(vllm/entrypoints/openai/completion/protocol.py ``to_sampling_params``: "user -> server default -> OpenAI default",
the chat's alike), and ``LLM.generate`` / ``LLM.chat`` without sampling params use them
(vllm/entrypoints/llm.py ``get_default_sampling_params``).

max_tokens as vLLM bounds it (vllm/entrypoints/openai/chat_completion/serving.py and completion/serving.py
``override_max_tokens``, vllm/entrypoints/serve/utils/api_utils.py ``get_max_tokens``): the file's
max_new_tokens is a chat's default only (a completion's max_tokens defaults to OpenAI's 16 there); taken from a
--generation-config DIR or from the override it also caps the max_tokens a request gives.

Where outpace differs: an absent file gives no defaults (vLLM then builds a generation config from config.json's
generation keys: vllm/transformers_utils/config.py ``try_get_generation_config``, ``from_model_config``); a
--generation-config DIR without the file, and an override key vLLM would ignore, are refused by name. Values are
taken as given: with transformers 4, vLLM's ``to_diff_dict`` drops a value equal to transformers' own default,
which changes only ``top_k: 50`` (transformers 4's default top_k).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from outpace.sampling_params import SamplingParams
from outpace.validation import INT64_MAX, ConfigError, ConfigFields, read_json_object

logger = logging.getLogger(__name__)

FILE = "generation_config.json"
OVERRIDE_FLAG = "--override-generation-config"
# the file's keys vLLM takes -> SamplingParams' names
SAMPLING_KEYS = {
    "repetition_penalty": "repetition_penalty",
    "temperature": "temperature",
    "top_k": "top_k",
    "top_p": "top_p",
    "min_p": "min_p",
    "max_new_tokens": "max_tokens",
}
_OWN_DEFAULTS = {f.name: f.default for f in dataclasses.fields(SamplingParams)}


@dataclass(frozen=True)
class GenerationDefaults:
    """``params``: SamplingParams field -> the value a request that leaves the field unset gets; ``max_tokens_cap``:
    the largest max_tokens a server request may get (vLLM's ``override_max_tokens``); ``sources``: where they were
    read (files, the override flag)."""

    params: dict[str, Any] = field(default_factory=dict)
    max_tokens_cap: int | None = None
    sources: tuple[str, ...] = ()

    def value(self, name: str, given: Any) -> Any:
        """A request's field ``name``: ``given`` when the request set it (not None), else this default, else
        SamplingParams' own."""
        if given is not None:
            return given
        return self.params.get(name, _OWN_DEFAULTS[name])

    def sampling_params(self) -> SamplingParams:
        """What ``LLM.generate`` uses without sampling params (vLLM's ``LLM.get_default_sampling_params``)."""
        return SamplingParams(**self.params)

    def log(self) -> None:
        """Say at start-up which defaults requests get, as vLLM does; nothing when there are none."""
        if self.params:
            logger.info(
                "default sampling params from %s: %s (a request's own values win; --generation-config "
                "vllm ignores the model's %s)",
                " and ".join(self.sources),
                self.params,
                FILE,
            )


def read_generation_defaults(
    model: str | Path, generation_config: str = "auto", override: dict[str, Any] | None = None
) -> GenerationDefaults:
    """The defaults of ``model``'s generation_config.json (``generation_config`` "auto"), of none ("vllm") or of
    the one in the folder ``generation_config``, with ``override``'s keys set over them. A value of the wrong type
    or range raises ``ConfigError`` naming the file (or the override flag) and the field."""
    values: dict[str, Any] = {}
    sources: list[str] = []
    if generation_config != "vllm":
        folder = Path(model if generation_config == "auto" else generation_config)
        path = folder / FILE
        if path.is_file():
            values.update(_sampling_keys(read_json_object(path), str(path)))
            sources.append(str(path))
        elif generation_config != "auto":
            raise ConfigError(
                f"--generation-config {generation_config}: there is no {path}: give a folder holding a "
                f"{FILE}, auto (the model's) or vllm (none)"
            )
    overridden = _sampling_keys(override or {}, OVERRIDE_FLAG, strict=True)
    if overridden:
        sources.append(OVERRIDE_FLAG)
    values.update(overridden)
    values = {name: value for name, value in values.items() if value is not None}
    cap_from = values if generation_config not in ("auto", "vllm") else overridden
    return GenerationDefaults(values, cap_from.get("max_tokens"), tuple(sources))


def _sampling_keys(data: dict[str, Any], source: str, strict: bool = False) -> dict[str, Any]:
    """The sampling keys of ``data`` by SamplingParams' names, each value checked (null kept: it unsets the key);
    ``strict``: a key vLLM would ignore is refused."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: must be a JSON object, got {data!r}")
    unknown = sorted(set(data) - set(SAMPLING_KEYS)) if strict else []
    if unknown:
        raise ConfigError(
            f"{source}: {', '.join(map(repr, unknown))} is not a sampling key vLLM takes from a "
            f"generation config: one of {', '.join(SAMPLING_KEYS)}"
        )
    fields = ConfigFields(data, source)
    taken = {}
    for key, name in SAMPLING_KEYS.items():
        if key not in data:
            continue
        value = data[key]
        if value is not None:
            if key == "top_k":
                fields.integer(key, minimum=-1, maximum=INT64_MAX)
            elif key == "max_new_tokens":
                fields.integer(key, maximum=INT64_MAX)
            else:
                fields.number(key)
            try:
                SamplingParams(**{name: value})
            except ConfigError as e:
                raise fields.fail(key, value, str(e).partition("must be ")[2] or str(e)) from None
        taken[name] = value
    return taken
