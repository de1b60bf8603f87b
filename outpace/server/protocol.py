"""OpenAI request bodies (pydantic) read as vLLM reads them, and the OpenAI error shape.

Field names follow OpenAI's API; ``top_k``, ``min_p``, ``repetition_penalty``, ``stop_token_ids``,
``ignore_eos``, ``min_tokens``, ``include_stop_str_in_output``, ``skip_special_tokens``,
``allowed_token_ids``, ``structured_outputs`` (and the older ``guided_json``, ``guided_regex``, ``guided_choice``,
``guided_grammar``), ``add_special_tokens`` and ``add_generation_prompt`` are vLLM's extensions. Values
are read as vLLM reads them, in pydantic's lax mode ("5" and 5.0 are 5, "true" is true), never NaN or
infinity; token ids must be integers. Every failure is a 400 naming its field.

A field this server does not implement is refused by name, never ignored: a null value counts as
absent, and a few vLLM fields are taken at the one value that asks for nothing more (``NEUTRAL``).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    Strict,
    ValidationError,
    field_validator,
    model_validator,
)

from outpace.chat_messages import MessageError, template_messages
from outpace.sampling_params import MAX_LOGPROBS, StructuredOutputsParams
from outpace.structured.grammar import GrammarDeadEnd
from outpace.validation import ConfigError

MAX_SEED = 2**63 - 1
MAX_STOP_STRINGS = 16
UNSEEDED = -1  # vLLM's seed meaning "no seed" (its SamplingParams turns -1 into None)

# vLLM fields outpace does not implement, accepted at the value that asks for nothing (vLLM's default).
NEUTRAL: dict[str, Any] = {
    "spaces_between_special_tokens": True,
    "use_beam_search": False,
    "length_penalty": 1.0,
    "priority": 0,
    "echo": False,  # (a chat's: the completions' echo is implemented)
    "return_tokens_as_token_ids": False,
    "return_token_ids": False,
    "bad_words": [],
}


class APIError(Exception):
    """An error answered as OpenAI does: ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        type: str = "invalid_request_error",
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.type = type

    def to_dict(self) -> dict:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param, code)


def unsupported(message: str, param: str) -> APIError:
    return bad_request(message, param, "unsupported_parameter")


NonNegFloat = Annotated[float, Field(ge=0)]
Probability = Annotated[float, Field(ge=0, le=1)]
PositiveInt = Annotated[int, Field(ge=1)]
NonEmptyStr = Annotated[str, Field(min_length=1)]
TokenId = Annotated[int, Strict(), Field(ge=0, le=2**31 - 1)]


class _Body(BaseModel):
    # NOTE: undeclared fields are kept (model_extra) so that ``refuse_unknown_fields`` names them.
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _null_is_absent(cls, data: Any) -> Any:
        """A null field takes its default: OpenAI's API marks most request fields nullable (n, stream, echo, ...),
        clients that write every field send null, and vLLM's request models take None for them."""
        if isinstance(data, dict):
            return {key: value for key, value in data.items() if value is not None}
        return data


class StreamOptions(_Body):
    """As vLLM reads them: given, ``stream_options`` asks for a usage chunk unless ``include_usage`` is false (vLLM's
    default, where OpenAI's is false); ``continuous_usage_stats`` (usage on every chunk too) needs it."""

    include_usage: bool = True
    continuous_usage_stats: bool = False


class StructuredOutputs(_Body):
    """vLLM's ``structured_outputs`` object: exactly one constraint."""

    json_: str | dict[str, Any] | None = Field(None, alias="json")
    regex: NonEmptyStr | None = None
    choice: Annotated[list[NonEmptyStr], Field(min_length=1)] | None = None
    grammar: NonEmptyStr | None = None
    json_object: bool | None = None

    def given(self) -> dict[str, Any]:
        """The constraints set, by ``StructuredOutputsParams`` field name."""
        values = {"json": self.json_, "regex": self.regex, "choice": self.choice}
        values.update(grammar=self.grammar, json_object=self.json_object or None)
        return {name: value for name, value in values.items() if value is not None}


class SamplingFields(_Body):
    """What completions and chat completions share."""

    # the text after which the constraint holds (``StructuredOutputsParams.starts_after``): set by the server
    _starts_after: str | None = PrivateAttr(default=None)
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
    stop_token_ids: Annotated[list[TokenId], Field(max_length=256)] | None = None
    ignore_eos: bool = False
    min_tokens: Annotated[int, Field(ge=0, le=2**31 - 1)] = 0
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    seed: Annotated[int, Field(ge=UNSEEDED, le=MAX_SEED)] | None = None
    presence_penalty: Annotated[float, Field(ge=-2, le=2)] | None = None
    frequency_penalty: Annotated[float, Field(ge=-2, le=2)] | None = None
    repetition_penalty: Annotated[float, Field(gt=0)] | None = None
    logit_bias: dict[str, Annotated[float, Field(ge=-100, le=100)]] | None = None
    allowed_token_ids: Annotated[list[TokenId], Field(min_length=1)] | None = None
    response_format: dict[str, Any] | None = None
    structured_outputs: StructuredOutputs | None = None
    guided_json: str | dict[str, Any] | None = None  # vLLM's older names for structured_outputs
    guided_regex: NonEmptyStr | None = None
    guided_choice: Annotated[list[NonEmptyStr], Field(min_length=1)] | None = None
    guided_grammar: NonEmptyStr | None = None
    guided_decoding_backend: Literal["auto", "xgrammar"] | None = None  # outpace's one backend
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
        o = self.stream_options
        if o is not None and not self.stream:
            raise bad_request(
                "stream_options is only allowed when stream is true", "stream_options"
            )
        if o is not None and o.continuous_usage_stats and not o.include_usage:
            raise bad_request(
                "stream_options.continuous_usage_stats puts usage on every chunk: it needs include_usage "
                "true (the default), not false",
                "stream_options.continuous_usage_stats",
            )
        self.logit_bias_ids()
        self.constraint()

    @property
    def engine_seed(self) -> int | None:
        """The seed the engine gets: None for no seed (absent, or vLLM's -1)."""
        return None if self.seed == UNSEEDED else self.seed

    def logit_bias_ids(self) -> dict[int, float] | None:
        """``logit_bias`` with its keys (token ids as strings, OpenAI's form) as ints."""
        if not self.logit_bias:
            return None
        # NOTE: ASCII digits only: str.isdigit() also takes "²", which int() refuses (a 500 before).
        bad = [k for k in self.logit_bias if not (k.isascii() and k.isdigit())]
        if bad:
            raise bad_request(f"logit_bias keys must be token ids, got {bad[0]!r}", "logit_bias")
        return {int(k): v for k, v in self.logit_bias.items()}

    def constraint_source(self) -> tuple[str, dict[str, Any]] | None:
        """The request field that constrains the output (``response_format``, ``structured_outputs.X``
        or ``guided_X``) and the ``StructuredOutputsParams`` arguments it means; None: unconstrained.
        These fields are exclusive, as in vLLM."""
        given = []
        fmt = self.response_format
        kind = None if fmt is None else fmt.get("type")
        if fmt is not None and kind is None:  # (OpenAI's and vLLM's ResponseFormat require it)
            raise bad_request(
                "response_format needs a type: text, json_object or json_schema",
                "response_format.type",
            )
        if kind not in (None, "text", "json_object", "json_schema"):
            raise unsupported(
                f"response_format type {kind!r} is not supported (text, json_object, json_schema)",
                "response_format",
            )
        if fmt is not None:
            _refuse_unknown_keys(fmt, _RESPONSE_FORMAT_KEYS, "response_format")
            if kind != "json_schema" and fmt.get("json_schema") is not None:
                raise bad_request(
                    f"response_format.json_schema applies to type json_schema, not {kind!r}",
                    "response_format.json_schema",
                )
        if kind == "json_object":
            given.append(("response_format", {"json_object": True}))
        if kind == "json_schema":
            described = fmt.get("json_schema")
            if not isinstance(described, dict):
                param = "response_format.json_schema"
                raise bad_request(f"{param} must be an object holding the schema", param)
            _refuse_unknown_keys(described, _JSON_SCHEMA_KEYS, "response_format.json_schema")
            schema = described.get("schema")
            param = "response_format.json_schema.schema"
            if not isinstance(schema, dict):
                raise bad_request(f"{param} must be a JSON schema object", param)
            given.append((param, {"json": schema}))
        if self.structured_outputs is not None:
            chosen = self.structured_outputs.given()
            if len(chosen) != 1:
                raise bad_request(
                    "structured_outputs needs exactly one of json, regex, choice, grammar, "
                    f"json_object; got {', '.join(chosen) or 'none'}",
                    "structured_outputs",
                )
            ((name, value),) = chosen.items()
            given.append((f"structured_outputs.{name}", {name: value}))
        for name in ("json", "regex", "choice", "grammar"):
            value = getattr(self, f"guided_{name}")
            if value is not None:
                given.append((f"guided_{name}", {name: value}))
        if len(given) > 1:
            raise bad_request(
                f"{given[0][0]} and {given[1][0]} both constrain the output: give one", given[1][0]
            )
        return given[0] if given else None

    @property
    def constraint_param(self) -> str | None:
        """The field to name when the constraint does not compile."""
        source = self.constraint_source()
        return None if source is None else source[0]

    def name_constraint(self, message: str) -> str:
        """An engine failure's ``message`` naming the constraint by the field this request gave it: the engine
        names a grammar's dead end (structured/grammar.py ``GrammarDeadEnd``) ``structured_outputs.<kind>``,
        whichever field (``constraint_source``) set it, ``guided_regex`` or ``response_format`` too."""
        source = self.constraint_source()
        if source is None:
            return message
        param, kwargs = source
        (kind,) = kwargs  # (the one StructuredOutputsParams field the constraint sets)
        dead_end = GrammarDeadEnd.__name__  # (the engine's failure says "<type>: <message>")
        return message.replace(
            f"{dead_end}: structured_outputs.{kind} ", f"{dead_end}: {param} ", 1
        )

    def constraint(self) -> StructuredOutputsParams | None:
        """The output's constraint, from whichever field gives it (``constraint_source``)."""
        source = self.constraint_source()
        if source is None:
            return None
        param, kwargs = source
        try:
            return StructuredOutputsParams(**kwargs, starts_after=self._starts_after)
        except ConfigError as e:
            raise bad_request(f"invalid {param}: {e}", param) from None

    def wanted_logprobs(self) -> int | None:
        """Top log-probabilities per output token the response shows (None: no logprobs)."""
        return None

    @property
    def sequences_per_prompt(self) -> int:
        """Sequences generated per prompt (completions: ``best_of``, of which the ``n`` most likely
        are returned)."""
        return self.n

    def requested_max_tokens(self) -> tuple[int | None, str]:
        return self.max_tokens, "max_tokens"

    @property
    def include_usage(self) -> bool:
        """A usage chunk ends the stream."""
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        return self.include_usage and self.stream_options.continuous_usage_stats


# OpenAI's response_format and its json_schema (vLLM's ResponseFormat, JsonSchemaResponseFormat): kept as dicts,
# their keys checked here so that a key outpace does not read is refused by name, not ignored.
_RESPONSE_FORMAT_KEYS = ("type", "json_schema")
_JSON_SCHEMA_KEYS = ("name", "description", "schema", "strict")


def _refuse_unknown_keys(value: dict[str, Any], known: tuple[str, ...], at: str) -> None:
    """400 naming the first key of ``value`` (the object at ``at``) not among ``known``; a null counts as absent."""
    for key, item in value.items():
        if item is not None and key not in known:
            raise unsupported(
                f"{at}.{key} is not a field this server implements (refused rather than ignored): "
                f"{at} takes {', '.join(known)}",
                f"{at}.{key}",
            )


class CompletionRequest(SamplingFields):
    # str | list[str] | list[int] | list[list[int]]; checked by ``prompts()`` with precise messages.
    prompt: Any = None
    # NOTE: 0 only with echo: the prompt (and its log-probabilities) alone, as lm-evaluation-harness asks.
    max_tokens: Annotated[int, Field(ge=0)] | None = None
    echo: bool = False
    suffix: str | None = None
    best_of: PositiveInt | None = None
    logprobs: Annotated[int, Field(ge=0)] | None = None
    add_special_tokens: bool = True

    def check_supported(self) -> None:
        super().check_supported()
        if self.logprobs is not None and self.logprobs > MAX_LOGPROBS:
            raise bad_request(f"logprobs={self.logprobs} is more than {MAX_LOGPROBS}", "logprobs")
        if self.max_tokens == 0 and not self.echo:
            raise bad_request(
                "max_tokens=0 generates nothing: it is allowed only with echo (the prompt and, with "
                "logprobs, its log-probabilities)",
                "max_tokens",
            )
        if self.suffix:
            raise unsupported("suffix is not supported", "suffix")
        if self.best_of is not None and self.best_of < self.n:
            raise bad_request(f"best_of={self.best_of} must be >= n={self.n}", "best_of")
        if self.best_of not in (None, self.n) and self.stream:
            raise unsupported("best_of with stream is not supported", "best_of")

    @property
    def echo_only(self) -> bool:
        """The answer is the echoed prompt alone (``max_tokens`` 0)."""
        return self.echo and self.max_tokens == 0

    @property
    def prompt_logprobs(self) -> int | None:
        """Log-probabilities of the prompt's tokens, which echo with logprobs shows (vLLM's rule)."""
        return self.logprobs if self.echo else None

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
            raise bad_request(_PROMPT_SHAPES, "prompt")
        if not p:
            raise bad_request("prompt is empty", "prompt")
        if all(_is_token(t) for t in p):
            return [list(p)]
        if all(isinstance(s, str) for s in p):
            return list(p)
        if all(isinstance(ids, list) and all(_is_token(t) for t in ids) for ids in p):
            return [list(ids) for ids in p]
        raise bad_request(_PROMPT_SHAPES, "prompt")


_PROMPT_SHAPES = "prompt must be a string, a list of strings, a list of token ids or a list of lists of token ids"


def _is_token(t: Any) -> bool:
    return isinstance(t, int) and not isinstance(t, bool)


class ContentPart(_Body):
    type: str
    text: str | None = None


class FunctionCall(_Body):
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class MessageToolCall(_Body):
    """A tool call of an earlier assistant message, sent back with the conversation."""

    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Body):
    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[MessageToolCall] | None = None  # an assistant's
    tool_call_id: str | None = None  # a tool's answer: the call it answers
    reasoning_content: str | None = None  # an assistant's thinking (templates that show it use it)


def conversation(
    messages: list[ChatMessage], content_format: str = "string"
) -> list[dict[str, Any]]:
    """Messages as the chat template expects them, their content in the template's ``content_format``
    (outpace/chat_messages.py ``template_messages``, which ``LLM.chat`` shares); a message it refuses is a 400
    naming the field."""
    try:
        return template_messages([m.model_dump() for m in messages], content_format)
    except MessageError as e:
        raise bad_request(str(e), f"messages.{e.param}", e.code) from None


def tool_dicts(tools: list[Tool] | None) -> list[dict[str, Any]] | None:
    """The tools as the chat template and the tool-call parsers take them."""
    return [t.model_dump(exclude_none=True) for t in tools] if tools else None


def check_template_kwargs(kwargs: dict[str, Any] | None) -> None:
    """chat_template_kwargs are the template's variables: what the call sets (apply_chat_template's own
    parameters, the ``messages`` it renders) is refused."""
    for key in kwargs or {}:
        if key in _TEMPLATE_PARAMETERS:
            raise bad_request(
                f"{key} is set by the server's call of the chat template, not by chat_template_kwargs "
                "(the template's other variables)",
                f"chat_template_kwargs.{key}",
            )


class FunctionDefinition(_Body):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema
    strict: bool | None = (
        None  # true: only with a forced tool choice (its constraint is the schema)
    )


class Tool(_Body):
    type: Literal["function"]
    function: FunctionDefinition


class ToolChoiceFunction(_Body):
    name: str


class NamedToolChoice(_Body):
    type: Literal["function"]
    function: ToolChoiceFunction


# apply_chat_template's own parameters and render's ``messages`` (transformers' chat_template_utils.py
# ``render_jinja_template``): not for chat_template_kwargs to set (a collision was a TypeError, a parameter such as
# ``sanitize_control_tokens`` changed the call)
_TEMPLATE_PARAMETERS = {
    "self",
    "conversation",
    "conversations",
    "messages",
    "sanitize_control_tokens",
    "tools",
    "documents",
    "chat_template",
    "add_generation_prompt",
    "continue_final_message",
    "tokenize",
    "padding",
    "truncation",
    "max_length",
    "return_tensors",
    "return_dict",
    "return_assistant_tokens_mask",
    "tokenizer_kwargs",
}


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage]
    max_completion_tokens: PositiveInt | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Field(ge=0)] | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None  # false: the first tool call alone
    include_reasoning: bool = True  # vLLM's: false drops reasoning_content
    separate_reasoning: bool = True  # SGLang's: false leaves the thinking in the content
    stream_reasoning: bool = True  # SGLang's: false sends the thinking in one delta once it ends
    chat_template_kwargs: dict[str, Any] | None = (
        None  # extra variables of the chat template (vLLM's)
    )
    add_generation_prompt: bool = True
    continue_final_message: bool = (
        False  # vLLM's: the answer continues the last (assistant) message
    )
    add_special_tokens: bool = False  # the chat template holds the special tokens (vLLM's default)

    def check_supported(self) -> None:
        super().check_supported()
        if self.top_logprobs is not None and not self.logprobs:
            raise bad_request("top_logprobs needs logprobs: true", "top_logprobs")
        if (self.top_logprobs or 0) > MAX_LOGPROBS:
            raise bad_request(
                f"top_logprobs={self.top_logprobs} is more than {MAX_LOGPROBS}", "top_logprobs"
            )
        check_template_kwargs(self.chat_template_kwargs)
        if self.tool_choice == "auto" and self.tools is None:  # (vLLM's and OpenAI's refusal)
            raise bad_request(
                'tool_choice "auto" chooses among tools, and none are given: give tools or leave '
                "tool_choice out",
                "tool_choice",
            )
        if self.continue_final_message:
            if self.add_generation_prompt:
                raise bad_request(
                    "continue_final_message needs add_generation_prompt: false (the answer continues the "
                    "last message instead of opening a new one)",
                    "continue_final_message",
                )
            if not self.messages or self.messages[-1].role != "assistant":
                raise bad_request(
                    "continue_final_message needs the last message to be the assistant's",
                    "continue_final_message",
                )
        for i, tool in enumerate(self.tools or []):
            if tool.function.strict and self.forced_tool is None:
                raise unsupported(
                    "strict arguments are not enforced where the model chooses its calls: tool_choice "
                    '"required" or a named function constrains them to the schema',
                    f"tools.{i}.function.strict",
                )
        if not self.messages:
            raise bad_request("messages is empty: at least one message is needed", "messages")

    def wanted_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    def requested_max_tokens(self) -> tuple[int | None, str]:
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens, "max_completion_tokens"
        return self.max_tokens, "max_tokens"

    def conversation(self) -> list[dict[str, Any]]:
        return conversation(self.messages)

    @property
    def calls_tools(self) -> bool:
        """Whether the output is parsed for tool calls in the model's format: tools given, tool_choice auto."""
        return bool(self.tools) and self.tool_choice in (None, "auto")

    @property
    def forced_tool(self) -> str | None:
        """The function tool_choice names, or "required" (a call of any); None: the model chooses."""
        if isinstance(self.tool_choice, NamedToolChoice):
            return self.tool_choice.function.name
        return "required" if self.tool_choice == "required" else None

    def constraint_source(self) -> tuple[str, dict[str, Any]] | None:
        """A forced tool choice constrains the output to JSON, as vLLM's does
        (vllm/entrypoints/openai/protocol.py ``_get_json_schema_from_tool``): the named function's arguments
        (the field ``tools.<i>.function.parameters``), or for "required" an array of at least one
        ``{"name", "parameters"}`` of any tool (the field ``tool_choice``)."""
        given, forced = super().constraint_source(), self.forced_tool
        if forced is None:
            return given
        if given is not None:
            raise bad_request(
                f"tool_choice and {given[0]} both constrain the output: give one", given[0]
            )
        tools: dict[str, dict[str, Any]] = {}
        for i, t in enumerate(self.tools or []):
            if t.function.name in tools:  # (one definition was dropped from the constraint)
                raise bad_request(
                    f"tools define the function {t.function.name!r} twice, and a forced tool_choice "
                    "constrains the call to the schema of one",
                    f"tools.{i}.function.name",
                )
            tools[t.function.name] = t.function.parameters or {"type": "object"}
        if not tools:
            raise bad_request(
                "tool_choice forces a tool call, but no tools are given", "tool_choice"
            )
        if forced not in (*tools, "required"):
            raise bad_request(
                f"tool_choice names the function {forced!r}, which tools do not define",
                "tool_choice.function.name",
            )
        if forced != "required":  # (the named function's schema: a fault in it is that field's)
            i = next(i for i, t in enumerate(self.tools) if t.function.name == forced)
            return f"tools.{i}.function.parameters", {"json": tools[forced]}
        hoisted, tools = _hoist_definitions(tools)
        calls = [
            {
                "properties": {"name": {"type": "string", "enum": [name]}, "parameters": schema},
                "required": ["name", "parameters"],
            }
            for name, schema in tools.items()
        ]
        items = {"type": "object", "anyOf": calls}
        return "tool_choice", {"json": {"type": "array", "minItems": 1, "items": items, **hoisted}}

    def tool_dicts(self) -> list[dict[str, Any]] | None:
        return tool_dicts(self.tools)


def _hoist_definitions(
    tools: dict[str, dict[str, Any]],
) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    """(the tools' ``$defs`` and ``definitions``, merged; each tool's parameters without them): tool_choice "required"
    nests every tool's parameters in one schema, where their "#/$defs/..." references must find the definitions
    at its top, as vLLM's ``get_tool_schema_defs`` puts them (pydantic writes such schemas). A name two tools define
    differently is refused."""
    hoisted: dict[str, dict[str, Any]] = {}
    stripped = {}
    for name, schema in tools.items():
        for key in ("$defs", "definitions"):
            own = schema.get(key) or {}
            if not isinstance(own, dict):
                raise bad_request(f"tool {name!r}: parameters.{key} must be an object", "tools")
            merged = hoisted.setdefault(key, {})
            for ref, definition in own.items():
                if merged.setdefault(ref, definition) != definition:
                    raise bad_request(
                        f'tools define {key}/{ref} differently, and tool_choice "required" puts every '
                        f"tool's {key} in one schema (tool {name!r})",
                        "tools",
                    )
        stripped[name] = {k: v for k, v in schema.items() if k not in ("$defs", "definitions")}
    return {k: v for k, v in hoisted.items() if v}, stripped


class TokenizeRequest(_Body):
    """vLLM's /tokenize: a ``prompt`` (special tokens added by default) or chat ``messages`` (the
    chat template applied, no special tokens added by default)."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False  # (messages: the text ends inside the last message)
    return_token_strs: bool = False
    tools: list[Tool] | None = None  # (messages: as a chat's)
    chat_template_kwargs: dict[str, Any] | None = None

    def check_supported(self) -> None:
        if (self.prompt is None) == (self.messages is None):
            raise bad_request("give either prompt or messages", "prompt")
        chat_only = (
            "tools",
            "chat_template_kwargs",
            "add_generation_prompt",
            "continue_final_message",
        )
        given = [name for name in chat_only if name in self.model_fields_set]
        if self.prompt is not None and given:
            raise bad_request(f"{given[0]} applies to messages, not to a prompt", given[0])
        check_template_kwargs(self.chat_template_kwargs)
        if self.continue_final_message and self.add_generation_prompt:
            raise bad_request(
                "continue_final_message needs add_generation_prompt: false (the text ends inside the "
                "last message instead of opening a new one)",
                "continue_final_message",
            )

    def tool_dicts(self) -> list[dict[str, Any]] | None:
        return tool_dicts(self.tools)

    @property
    def special_tokens(self) -> bool:
        """Whether the tokenizer adds its special tokens (vLLM: for a prompt yes, for messages no)."""
        return (
            self.add_special_tokens
            if self.add_special_tokens is not None
            else self.messages is None
        )


class DetokenizeRequest(_Body):
    """vLLM's /detokenize: token ids back to text."""

    model: str | None = None
    tokens: list[TokenId]


def parse_body(model: type[BaseModel], body: bytes) -> Any:
    """Validate a JSON body; any problem, an unknown field included, becomes a 400 naming the field."""
    try:
        parsed = model.model_validate_json(body)
    except ValidationError as e:
        raise bad_request(*_describe(e)) from None
    refuse_unknown_fields(parsed)
    return parsed


def refuse_unknown_fields(body: BaseModel, at: str = "") -> None:
    """400 naming the first field ``body`` (or a model inside it) does not declare, unless it is null
    or a ``NEUTRAL`` field at its neutral value."""
    for name, value in (body.model_extra or {}).items():
        if value is None or (not at and name in NEUTRAL and value == NEUTRAL[name]):
            continue
        param = at + name
        if not at and name in NEUTRAL:
            raise unsupported(
                f"{param}={_short(value)} is not supported: only {NEUTRAL[name]!r} (its default)",
                param,
            )
        raise unsupported(
            f"{param} is not a field this server implements (refused rather than ignored)", param
        )
    for name, field in type(body).model_fields.items():
        value = getattr(body, name)
        key = field.alias or name
        items = enumerate(value) if isinstance(value, list) else [(None, value)]
        for i, item in items:
            if isinstance(item, BaseModel):
                refuse_unknown_fields(item, f"{at}{key}." + ("" if i is None else f"{i}."))


def _describe(e: ValidationError) -> tuple[str, str | None]:
    errors = e.errors(include_url=False)
    first = errors[0]
    if first["type"] == "json_invalid":
        reason = first["msg"].removeprefix("Invalid JSON: ")
        return f"the request body is not valid JSON: {reason}", None
    if first["type"] == "model_type" and not first["loc"]:
        return "the request body must be a JSON object", None
    # NOTE: a value that fails a union fails each member; the member it went deepest in says most.
    within = _field(first["loc"]) or ""
    first = max(
        (e for e in errors if (_field(e["loc"]) or "").startswith(within)),
        key=lambda e: len(e["loc"]),
    )
    param = _field(first["loc"])
    msg = first["msg"].removeprefix("Value error, ")
    if first["type"] == "missing":
        return f"{param} is required", param
    value = first.get("input")
    shown = "" if isinstance(value, (dict, list)) else f" (got {_short(value)})"
    others = len({_field(e["loc"]) for e in errors}) - 1  # a union's failed members count once
    more = f" (and {others} more problems)" if others else ""
    return f"invalid {param}: {msg}{shown}{more}", param


_UNION_MEMBER = re.compile(r"str|int|float|bool|.*[\[\]-].*")


def _field(loc: tuple) -> str | None:
    """The dotted field path of an error's location, less the union members pydantic names in it
    (``guided_json.str``: the value failed the ``str`` member of ``str | dict``; ``tool_choice.NamedToolChoice``:
    the ``NamedToolChoice`` member of ``tool_choice``'s union)."""
    kept = [
        str(x)
        for x in loc
        if isinstance(x, int) or not (_UNION_MEMBER.fullmatch(x) or x in _model_names())
    ]
    return ".".join(kept) or None


def _model_names() -> set[str]:
    """The request models' class names, which pydantic puts in an error's location for a union member that is a
    model (``tool_choice.NamedToolChoice.type``): not a field of the request."""
    names, todo = set(), [_Body]
    while todo:
        cls = todo.pop()
        names.add(cls.__name__)
        todo.extend(cls.__subclasses__())
    return names


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
