"""From a parsed OpenAI request body to the engine's inputs: prompt token ids, ``SamplingParams`` and
the engine's requests, every refusal a 400 naming its field (server/protocol.py ``bad_request``).

The routes (server/app.py) parse the body; ``RequestInputs`` tokenizes it (call it from a worker
thread), checks it against the model and the server's limits, and builds what ``open_stream`` takes.
"""

from __future__ import annotations

from typing import Any

from outpace.chat_messages import NO_TEMPLATE_FOUND, content_format
from outpace.generation_defaults import GenerationDefaults
from outpace.sampling_params import SamplingParams
from outpace.server.protocol import (
    APIError,
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    SamplingFields,
    bad_request,
    conversation,
)
from outpace.structured.grammar import ConstraintError
from outpace.validation import ConfigError, RequestFieldError


class RequestInputs:
    """The tokenizer, vocabulary and context of ``engine`` (an ``AsyncEngine`` or its replicated
    twin, read at each call) with the server's ``max_tokens_limit`` per request and ``max_choices``
    (prompts x sequences) per request; ``defaults`` fill the sampling fields a request leaves unset (the model's
    generation_config.json: outpace/generation_defaults.py); ``chat_template``, where given, renders chats in the
    place of the tokenizer's (``--chat-template``)."""

    def __init__(
        self,
        engine,
        max_tokens_limit: int,
        max_choices: int,
        defaults: GenerationDefaults | None = None,
        chat_template: str | None = None,
    ) -> None:
        self.engine, self.max_tokens_limit, self.max_choices = engine, max_tokens_limit, max_choices
        self.defaults = defaults or GenerationDefaults()
        self.chat_template = chat_template

    def tokenizer(self):
        if self.engine.tokenizer is None:
            raise bad_request("this model has no tokenizer: send token ids")
        return self.engine.tokenizer

    def chat_text(
        self,
        messages: list[ChatMessage],
        add_generation_prompt: bool,
        tools: list[dict[str, Any]] | None = None,
        template_kwargs: dict[str, Any] | None = None,
        continue_final_message: bool = False,
    ) -> str:
        """The chat template applied to ``messages``, given ``tools`` and the variables ``template_kwargs``
        (e.g. Qwen3's ``enable_thinking``, DeepSeek-V3.1's ``thinking``); ``continue_final_message``: the text
        ends inside the last (assistant) message, which the answer continues."""
        tok = self.engine.tokenizer
        if tok is None:
            raise bad_request(
                "this model has no tokenizer (no tokenizer.json, tokenizer.model or vocab.json): send "
                "token ids to /v1/completions",
                "messages",
            )
        if not (self.chat_template or getattr(tok, "chat_template", None)):
            raise bad_request(
                f"this model has no chat template ({NO_TEMPLATE_FOUND}): serve it with "
                "--chat-template, or use /v1/completions",
                "messages",
            )
        try:
            template = tok.get_chat_template(self.chat_template, tools)
            return tok.apply_chat_template(
                conversation(messages, content_format(template)),
                chat_template=template,
                tools=tools,
                tokenize=False,
                add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message,
                **(template_kwargs or {}),
            )
        except APIError:
            raise
        except Exception as e:  # noqa: BLE001 - jinja raises for roles or shapes the template refuses
            raise bad_request(f"the chat template refused the messages: {e}", "messages") from None

    def tokenize_prompts(self, body: CompletionRequest) -> tuple[list[list[int]], list[str]]:
        """Each prompt's token ids and its text (what ``echo`` shows; "" for ids without echo)."""
        engine, prompts = self.engine, body.prompts()
        if len(prompts) * body.sequences_per_prompt > self.max_choices:
            raise bad_request(
                f"{len(prompts)} prompts x {body.sequences_per_prompt} sequences (n, best_of) is "
                f"more than the server's limit of {self.max_choices} choices per request",
                "prompt",
            )
        ids, texts = [], []
        for i, p in enumerate(prompts):
            if isinstance(p, str):
                if not p:
                    what = "prompt" if len(prompts) == 1 else f"prompt {i}"
                    raise bad_request(f"{what} is empty", "prompt")
                if engine.tokenizer is None:
                    raise bad_request(
                        "this model has no tokenizer: send the prompt as token ids", "prompt"
                    )
                ids.append(engine.tokenizer.encode(p, add_special_tokens=body.add_special_tokens))
                texts.append(p)
            else:
                if not p:
                    raise bad_request(f"prompt {i} is empty", "prompt")
                bad = [t for t in p if not 0 <= t < engine.vocab_size]
                if bad:
                    raise bad_request(
                        f"prompt token ids {bad[:5]} are outside the vocabulary "
                        f"[0, {engine.vocab_size})",
                        "prompt",
                    )
                ids.append(p)
                echoed = body.echo and engine.tokenizer is not None
                texts.append(engine.tokenizer.decode(p) if echoed else "")
        return ids, texts

    def tokenize_chat(self, body: ChatCompletionRequest) -> tuple[list[list[int]], list[str]]:
        """The one prompt of a chat: the templated messages' token ids and text."""
        text = self.chat_text(
            body.messages,
            body.add_generation_prompt,
            body.tool_dicts(),
            body.chat_template_kwargs,
            body.continue_final_message,
        )
        tok = self.engine.tokenizer
        return [tok.encode(text, add_special_tokens=body.add_special_tokens)], [text]

    def sampling_params(self, body: SamplingFields, prompt_len: int, param: str) -> SamplingParams:
        """The body's sampling fields for a prompt of ``prompt_len`` tokens; ``param`` names the
        prompt's field when the prompt leaves no room to generate. A field the body leaves unset takes the
        generation defaults' value; max_tokens as vLLM's ``get_max_tokens``: a chat's default is theirs, a
        completion's OpenAI's 16, and their ``max_tokens_cap`` bounds a given value too."""
        max_model_len, limit, defaults = (
            self.engine.max_model_len,
            self.max_tokens_limit,
            self.defaults,
        )
        requested, name = body.requested_max_tokens()
        room = max_model_len - prompt_len
        if room < 1:
            raise bad_request(
                f"the prompt has {prompt_len} tokens but the model's context holds "
                f"{max_model_len}: at most {max_model_len - 1} prompt tokens leave "
                "room to generate",
                param,
                "context_length_exceeded",
            )
        completion = isinstance(body, CompletionRequest)
        if requested is None:
            max_tokens = min(
                room, limit, 16 if completion else defaults.params.get("max_tokens", room)
            )
        elif requested == 0:  # echo alone: the engine makes one token, which the answer drops
            max_tokens = 1
        else:
            if requested > limit:
                raise bad_request(
                    f"{name}={requested} is more than the server's limit of {limit}", name
                )
            if requested > room:
                raise bad_request(
                    f"this model's maximum context length is {max_model_len} tokens, but "
                    f"{prompt_len + requested} were requested ({prompt_len} in the prompt, "
                    f"{requested} for the completion): lower {name} or shorten the prompt",
                    name,
                    "context_length_exceeded",
                )
            max_tokens = requested
        if requested != 0 and defaults.max_tokens_cap is not None:
            max_tokens = min(max_tokens, defaults.max_tokens_cap)
        logprobs = body.wanted_logprobs()
        if logprobs is None and body.sequences_per_prompt > body.n:
            logprobs = 0  # best_of ranks by cumulative log-probability
        try:
            return SamplingParams(
                temperature=defaults.value("temperature", body.temperature),
                top_p=defaults.value("top_p", body.top_p),
                top_k=defaults.value("top_k", body.top_k),
                min_p=defaults.value("min_p", body.min_p),
                max_tokens=max_tokens,
                stop=tuple(body.stop),
                stop_token_ids=tuple(body.stop_token_ids or ()),
                seed=body.engine_seed,
                ignore_eos=body.ignore_eos,
                min_tokens=body.min_tokens,
                include_stop_str_in_output=body.include_stop_str_in_output,
                skip_special_tokens=body.skip_special_tokens,
                presence_penalty=body.presence_penalty or 0.0,
                frequency_penalty=body.frequency_penalty or 0.0,
                repetition_penalty=defaults.value("repetition_penalty", body.repetition_penalty),
                logit_bias=body.logit_bias_ids(),
                allowed_token_ids=body.allowed_token_ids,
                logprobs=logprobs,
                prompt_logprobs=body.prompt_logprobs if completion else None,
                structured_outputs=body.constraint(),
            )
        except ConfigError as e:
            field = str(e).split("=")[0].split(".")[-1]
            raise bad_request(str(e).removeprefix("SamplingParams."), field) from None

    def engine_requests(
        self, body: SamplingFields, job_id: str, prompt_ids: list[list[int]], param: str
    ) -> list:
        """``body.sequences_per_prompt`` engine requests per prompt, ids ``{job_id}-{choice}``; a
        seeded body's choice c of a prompt samples with seed + c."""
        requests, per_prompt = [], body.sequences_per_prompt
        for p, ids in enumerate(prompt_ids):
            params = self.sampling_params(body, len(ids), param)
            for c in range(per_prompt):
                seeded = params
                if params.seed is not None and c > 0:
                    seeded = params.replace(seed=(params.seed + c) % 2**63)
                request_id = f"{job_id}-{p * per_prompt + c}"
                requests.append(self._new_request(body, ids, seeded, request_id, param))
        return requests

    def _new_request(
        self,
        body: SamplingFields,
        ids: list[int],
        params: SamplingParams,
        request_id: str,
        param: str,
    ):
        """The engine's checks of one request (a constraint that does not compile names its field)."""
        try:
            return self.engine.new_request(ids, params, request_id)
        except ConstraintError as e:
            where = body.constraint_param
            raise bad_request(f"invalid {where}: {e.detail}", where) from None
        except RequestFieldError as e:  # (a sampling parameter: the server's name for max_tokens)
            field = body.requested_max_tokens()[1] if e.field == "max_tokens" else e.field
            raise bad_request(str(e), field) from None
        except ValueError as e:
            raise bad_request(str(e), param) from None
