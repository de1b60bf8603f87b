"""OpenAI request bodies (pydantic), the OpenAI error shape, and the sampling parameters they map to.

Field names follow OpenAI's API; ``top_k``, ``min_p``, ``repetition_penalty``, ``stop_token_ids``,
``ignore_eos``, ``structured_outputs`` and ``add_generation_prompt`` are extensions (as in vLLM). Like OpenAI, unknown fields are ignored,
but a known field of the wrong type or out of range is an error: the models are strict (no
"5" -> 5 coercion, no NaN or infinity) and every failure becomes a 400 naming the field.
"""
from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from outpace.sampling_params import MAX_LOGPROBS, StructuredOutputsParams
from outpace.validation import ConfigError

MAX_SEED = 2**63 - 1
MAX_STOP_STRINGS = 16


class APIError(Exception):
    """An error answered as OpenAI does: ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 type: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = status, message, param, code, type

    def to_dict(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param, code)


NonNegFloat = Annotated[float, Field(ge=0)]
Probability = Annotated[float, Field(ge=0, le=1)]
PositiveInt = Annotated[int, Field(ge=1)]


class _Strict(BaseModel):
    # NOTE: extra fields are ignored (OpenAI's behaviour); known ones are checked strictly.
    model_config = ConfigDict(extra="ignore", strict=True, allow_inf_nan=False)


class StreamOptions(_Strict):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class _SamplingFields(_Strict):
    """What completions and chat completions share."""

    model: str | None = None
    max_tokens: PositiveInt | None = None
    temperature: NonNegFloat | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    top_k: Annotated[int, Field(ge=-1, le=2**31 - 1)] | None = None
    min_p: Probability | None = None
    n: PositiveInt = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: Any = Field(default_factory=list)  # str | list[str], normalized to a list below
    stop_token_ids: Annotated[list[Annotated[int, Field(ge=0, le=2**31 - 1)]], Field(max_length=256)] | None = None
    ignore_eos: bool = False
    seed: Annotated[int, Field(ge=0, le=MAX_SEED)] | None = None
    presence_penalty: Annotated[float, Field(ge=-2, le=2)] | None = None
    frequency_penalty: Annotated[float, Field(ge=-2, le=2)] | None = None
    repetition_penalty: Annotated[float, Field(gt=0)] | None = None
    logit_bias: dict[str, Annotated[float, Field(ge=-100, le=100)]] | None = None
    response_format: dict[str, Any] | None = None
    structured_outputs: dict[str, Any] | None = None  # vLLM's extension: json, regex, choice, grammar, json_object
    user: str | None = None

    @field_validator("stop", mode="before")
    @classmethod
    def _stop(cls, v: Any) -> list[str]:
        if v is None:
            return []
        if isinstance(v, str):
            v = [v]
        if not isinstance(v, list) or not all(isinstance(s, str) for s in v):
            raise ValueError("stop must be a string or a list of strings")
        if len(v) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings are allowed, got {len(v)}")
        if any(not s for s in v):
            raise ValueError("stop strings must not be empty")
        return v

    def check_supported(self) -> None:
        """Refuse (400) what outpace does not implement rather than ignore it silently."""
        if self.stream_options is not None and not self.stream:
            raise bad_request("stream_options is only allowed when stream is true", "stream_options")
        self.logit_bias_ids()
        self.constraint()

    def logit_bias_ids(self) -> dict[int, float] | None:
        """``logit_bias`` with its keys (token ids as strings, OpenAI's form) as ints."""
        if not self.logit_bias:
            return None
        bad = [k for k in self.logit_bias if not k.isdigit()]
        if bad:
            raise bad_request(f"logit_bias keys must be token ids, got {bad[0]!r}", "logit_bias")
        return {int(k): v for k, v in self.logit_bias.items()}

    def constraint(self) -> StructuredOutputsParams | None:
        """The output's constraint from ``response_format`` (text, json_object, json_schema) or
        ``structured_outputs``; anything else is refused by name."""
        fmt = self.response_format
        kind = None if fmt is None else fmt.get("type", "text")
        if kind not in (None, "text", "json_object", "json_schema"):
            raise bad_request(f"response_format type {kind!r} is not supported (text, json_object, json_schema)",
                              "response_format", "unsupported_parameter")
        if kind not in (None, "text") and self.structured_outputs is not None:
            raise bad_request("response_format and structured_outputs are exclusive", "structured_outputs")
        try:
            if kind == "json_object":
                return StructuredOutputsParams(json_object=True)
            if kind == "json_schema":
                schema = (fmt.get("json_schema") or {}).get("schema")
                if not isinstance(schema, dict):
                    raise bad_request("response_format.json_schema.schema must be a JSON schema object",
                                      "response_format")
                return StructuredOutputsParams(json=schema)
            if self.structured_outputs is not None:
                return StructuredOutputsParams(**self.structured_outputs)
        except (ConfigError, TypeError) as e:
            raise bad_request(f"invalid structured_outputs: {e}", "structured_outputs") from None
        return None

    def wanted_logprobs(self) -> int | None:
        """Top log-probabilities per output token the response shows (None: no logprobs)."""
        return None

    @property
    def sequences_per_prompt(self) -> int:
        """Sequences generated per prompt (completions: ``best_of``, of which the ``n`` most likely are returned)."""
        return self.n

    def requested_max_tokens(self) -> tuple[int | None, str]:
        return self.max_tokens, "max_tokens"

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(_SamplingFields):
    # str | list[str] | list[int] | list[list[int]]; checked by ``prompts()`` with precise messages.
    prompt: Any = None
    echo: bool = False
    suffix: str | None = None
    best_of: PositiveInt | None = None
    logprobs: Annotated[int, Field(ge=0)] | None = None

    def check_supported(self) -> None:
        super().check_supported()
        if self.logprobs is not None and self.logprobs > MAX_LOGPROBS:
            raise bad_request(f"logprobs={self.logprobs} is more than {MAX_LOGPROBS}", "logprobs")
        if self.logprobs is not None and (self.stream or self.echo):
            raise bad_request("logprobs with stream or echo are not supported", "logprobs", "unsupported_parameter")
        if self.suffix:
            raise bad_request("suffix is not supported", "suffix", "unsupported_parameter")
        if self.best_of is not None and self.best_of < self.n:
            raise bad_request(f"best_of={self.best_of} must be >= n={self.n}", "best_of")
        if self.best_of not in (None, self.n) and self.stream:
            raise bad_request("best_of with stream is not supported", "best_of", "unsupported_parameter")

    def wanted_logprobs(self) -> int | None:
        return self.logprobs

    @property
    def sequences_per_prompt(self) -> int:
        return self.best_of or self.n

    def prompts(self) -> list[str | list[int]]:
        """The prompt as a list of text or token-id prompts (a batch)."""
        p = self.prompt
        if p is None:
            raise bad_request("prompt is required", "prompt")
        if isinstance(p, str):
            return [p]
        if not isinstance(p, list):
            raise bad_request("prompt must be a string, a list of strings, a list of token ids or a list of "
                              "lists of token ids", "prompt")
        if not p:
            raise bad_request("prompt is empty", "prompt")
        if all(_is_token(t) for t in p):
            return [list(p)]
        if all(isinstance(s, str) for s in p):
            return list(p)
        if all(isinstance(ids, list) and all(_is_token(t) for t in ids) for ids in p):
            return [list(ids) for ids in p]
        raise bad_request("prompt must be a string, a list of strings, a list of token ids or a list of "
                          "lists of token ids", "prompt")


def _is_token(t: Any) -> bool:
    return isinstance(t, int) and not isinstance(t, bool)


class ContentPart(_Strict):
    type: str
    text: str | None = None


class ChatMessage(_Strict):
    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None

    def text(self, i: int) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        parts = []
        for j, part in enumerate(self.content):
            if part.type != "text" or part.text is None:
                raise bad_request(f"content part type {part.type!r} is not supported (only 'text')",
                                  f"messages.{i}.content.{j}", "unsupported_content")
            parts.append(part.text)
        return "".join(parts)


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage]
    max_completion_tokens: PositiveInt | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Field(ge=0)] | None = None
    tools: list[Any] | None = None
    functions: list[Any] | None = None
    tool_choice: Any = None
    add_generation_prompt: bool = True

    def check_supported(self) -> None:
        super().check_supported()
        if self.top_logprobs is not None and not self.logprobs:
            raise bad_request("top_logprobs needs logprobs: true", "top_logprobs")
        if (self.top_logprobs or 0) > MAX_LOGPROBS:
            raise bad_request(f"top_logprobs={self.top_logprobs} is more than {MAX_LOGPROBS}", "top_logprobs")
        if self.logprobs and self.stream:
            raise bad_request("logprobs with stream are not supported", "logprobs", "unsupported_parameter")
        if self.tools or self.functions:
            raise bad_request("tools are not supported", "tools", "unsupported_parameter")
        if self.tool_choice not in (None, "none", "auto"):
            raise bad_request("tool_choice is not supported", "tool_choice", "unsupported_parameter")
        if not self.messages:
            raise bad_request("messages is empty: at least one message is needed", "messages")

    def wanted_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    def requested_max_tokens(self) -> tuple[int | None, str]:
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens, "max_completion_tokens"
        return self.max_tokens, "max_tokens"

    def conversation(self) -> list[dict[str, str]]:
        """Messages as the chat template expects them (``developer`` is OpenAI's new name for system)."""
        out = []
        for i, m in enumerate(self.messages):
            role = "system" if m.role == "developer" else m.role
            out.append({"role": role, "content": m.text(i)})
        return out


def parse_body(model: type[_Strict], body: bytes) -> Any:
    """Validate a JSON body; any problem becomes a 400 naming the field."""
    try:
        return model.model_validate_json(body)
    except ValidationError as e:
        raise bad_request(*_describe(e)) from None


def _describe(e: ValidationError) -> tuple[str, str | None]:
    errors = e.errors(include_url=False)
    first = errors[0]
    if first["type"] == "json_invalid":
        return f"the request body is not valid JSON: {first['msg'].removeprefix('Invalid JSON: ')}", None
    if first["type"] == "model_type" and not first["loc"]:
        return "the request body must be a JSON object", None
    param = ".".join(str(x) for x in first["loc"]) or None
    msg = first["msg"].removeprefix("Value error, ")
    if first["type"] == "missing":
        return f"{param} is required", param
    value = first.get("input")
    shown = "" if isinstance(value, (dict, list)) or first["type"] == "missing" else f" (got {_short(value)})"
    more = f" (and {len(errors) - 1} more problems)" if len(errors) > 1 else ""
    return f"invalid {param}: {msg}{shown}{more}", param


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
