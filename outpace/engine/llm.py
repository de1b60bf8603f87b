"""The offline API: ``LLM(model=PATH).generate(prompts, params)``.

``LLM(PATH, tensor_parallel_size=N)`` shards the model over N ranks (outpace/distributed/): from a plain
process it starts ranks 1 .. N-1 itself (torch.multiprocessing spawn: a script must guard its top
level with ``if __name__ == "__main__":``, as for any spawned process); under ``torchrun
--nproc-per-node N`` the constructor on ranks > 0 serves rank 0 and then exits the process, so the
script's rest runs on rank 0 alone. ``close()`` (or leaving a ``with LLM(...) as llm:`` block) stops
the other ranks; collecting the object does too.
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Sequence
from typing import Any

from tqdm.auto import tqdm

from outpace.chat_messages import (
    NO_TEMPLATE_FOUND,
    MessageError,
    content_format,
    template_messages,
)
from outpace.config import EngineConfig
from outpace.engine.engine import LLMEngine
from outpace.generation_defaults import read_generation_defaults
from outpace.request import CompletionOutput, Request, RequestOutput
from outpace.sampling_params import SamplingParams
from outpace.speculative.metrics import SpecMetrics
from outpace.validation import RequestFieldError

Prompt = str | Sequence[int]
Conversation = list[dict[str, str]]


class LLM:
    def __init__(self, model: str, progress: bool = False, **engine_kwargs) -> None:
        config = EngineConfig(model=model, **engine_kwargs)
        # (read before the weights load: a bad generation_config.json is refused at once)
        self.generation_defaults = read_generation_defaults(
            config.model, config.generation_config, config.override_generation_config
        )
        self.generation_defaults.log()
        self.engine = LLMEngine(config, progress=progress)

    def close(self) -> None:
        self.engine.close()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def get_default_sampling_params(self) -> SamplingParams:
        """What ``generate`` and ``chat`` use without params: the model's generation_config.json sampling defaults
        (outpace/generation_defaults.py; vLLM's method of this name), else SamplingParams()."""
        return self.generation_defaults.sampling_params()

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        progress: bool = False,
    ) -> list[RequestOutput]:
        """Generate for every prompt (text or token ids); outputs come back in prompt order, one per prompt
        with its ``n`` completions in ``outputs``.

        ``n`` and ``best_of`` (vLLM's meaning): ``best_of`` sequences (default ``n``) are sampled per prompt,
        the i-th with seed ``seed + i`` when the params have a seed, and the ``n`` with the highest
        cumulative log-probability are returned, best first (with ``best_of`` == ``n``: all, in order).
        Every prompt is validated before any is queued, so one bad prompt leaves the engine untouched. Without
        ``params``: ``get_default_sampling_params()``.
        """
        prompts = _prompt_list(prompts)
        if params is None:
            params = self.get_default_sampling_params()
        params_list = _params_list(params, len(prompts))
        if len(params_list) != len(prompts):
            raise ValueError(f"got {len(params_list)} SamplingParams for {len(prompts)} prompts")
        groups = [
            _requests_of(self.engine, i if len(prompts) > 1 else None, p, sp)
            for i, (p, sp) in enumerate(zip(prompts, params_list))
        ]
        for group in groups:
            for r in group:
                self.engine.submit(r)
        ids = [r.request_id for group in groups for r in group]
        results: dict[str, RequestOutput] = {}
        mine = set(ids)  # (the engine may serve other requests too)
        with tqdm(total=len(ids), desc="generating", disable=not progress) as bar:
            while len(results) < len(ids):
                for out in self.engine.step():
                    if out.finished and out.request_id in mine:
                        results[out.request_id] = out
                        bar.update(1)
        outputs = [
            _best(sp, [results[r.request_id] for r in group])
            for sp, group in zip(params_list, groups)
        ]
        _decode_logprobs(self.tokenizer, outputs)
        return outputs

    def chat(
        self,
        messages: Conversation | Sequence[Conversation],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        add_generation_prompt: bool = True,
        chat_template: str | None = None,
        progress: bool = False,
    ) -> list[RequestOutput]:
        """Generate replies to conversations (a list of ``{"role", "content"}`` messages, or a list of them)
        rendered by the tokenizer's chat template (or ``chat_template``); as ``generate`` otherwise. The
        template holds any special tokens, so none are added when it is tokenized (as vLLM does)."""
        tok = self.tokenizer
        if tok is None or not (chat_template or getattr(tok, "chat_template", None)):
            raise ValueError(
                f"model {self.engine.config.model} has no chat template ({NO_TEMPLATE_FOUND}): pass "
                "chat_template= or use generate()"
            )
        if not _is_sequence(messages):
            raise TypeError(
                f"messages is a {type(messages).__name__}: it must be a list of {{'role', 'content'}} "
                "messages or a list of such lists"
            )
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        template = tok.get_chat_template(chat_template)
        prompts = []
        for i, conversation in enumerate(conversations):
            messages = _template_messages(i, conversation, content_format(template))
            try:
                text = tok.apply_chat_template(
                    messages,
                    chat_template=template,
                    tokenize=False,
                    add_generation_prompt=add_generation_prompt,
                )
            except Exception as e:  # noqa: BLE001 - jinja raises for roles or shapes the template refuses
                raise ValueError(
                    f"conversation {i}: the chat template refused the messages: {e}"
                ) from None
            prompts.append(tok.encode(text, add_special_tokens=False))
        return self.generate(prompts, params, progress)


def _requests_of(
    engine: LLMEngine, index: int | None, prompt: Prompt, params: SamplingParams
) -> list[Request]:
    """The engine requests of one prompt (``_children``), made but not queued; a refusal of prompt ``index`` of
    several names it."""
    try:
        return [engine.new_request(prompt, child) for child in _children(params)]
    except ValueError as e:
        if index is None:
            raise
        message = f"prompt {index}: {e}"
        field = getattr(e, "field", None)  # (a RequestFieldError keeps naming its field)
        raise (
            ValueError(message) if field is None else RequestFieldError(field, message)
        ) from None


def _prompt_list(prompts: Any) -> list[Prompt]:
    """``generate``'s prompts as a list: one text or one list of token ids is one prompt. Anything else is refused
    with its index (bytes too, which would read as token ids, and vLLM's prompt dicts)."""
    if isinstance(prompts, str) or (
        _is_sequence(prompts) and len(prompts) and isinstance(prompts[0], numbers.Integral)
    ):
        return [prompts]
    if not _is_sequence(prompts):
        raise TypeError(
            f"prompts is a {type(prompts).__name__}: it must be a string, a list of token ids or a "
            "list of them"
        )
    for i, prompt in enumerate(prompts):
        if not (isinstance(prompt, str) or _is_sequence(prompt)):
            raise TypeError(
                f"prompt {i} is a {type(prompt).__name__}: a prompt is a string or a list of token ids"
            )
    return list(prompts)


def _template_messages(i: int, conversation: Any, content_format: str = "string") -> list[dict]:
    """Conversation ``i``'s messages as the chat template reads them, prepared as the server prepares them
    (outpace/chat_messages.py); a message it refuses is named with its conversation."""
    if not (
        _is_sequence(conversation)
        and conversation
        and all(isinstance(m, dict) and "role" in m and "content" in m for m in conversation)
    ):
        raise ValueError(
            f"conversation {i} must be a non-empty list of {{'role', 'content'}} messages"
        )
    try:
        return template_messages(conversation, content_format)
    except MessageError as e:
        raise ValueError(f"conversation {i} {e}") from None


def _is_sequence(value: Any) -> bool:
    """A list or tuple of items (not text: bytes iterate as integers)."""
    return isinstance(value, Sequence) and not isinstance(value, (str, bytes, bytearray))


def _params_list(params: Any, count: int) -> list[SamplingParams]:
    """The SamplingParams of each of ``count`` prompts: one for all, or a list of them."""
    if not isinstance(params, (list, tuple)):
        params = [params] * count
    for i, sp in enumerate(params):
        if not isinstance(sp, SamplingParams):
            raise TypeError(
                f"params {i} is a {type(sp).__name__}: params must be SamplingParams, a list of them "
                "(one per prompt) or None"
            )
    return list(params)


def _children(params: SamplingParams) -> list[SamplingParams]:
    """The engine requests of one prompt: ``best_of`` (or ``n``) single sequences; ranking by cumulative
    log-probability needs the chosen tokens' log-probabilities, asked for when the params did not."""
    count = params.best_of or params.n
    ranked = count > params.n
    one = params.replace(
        n=1, best_of=None, logprobs=0 if ranked and params.logprobs is None else params.logprobs
    )
    return [
        one if one.seed is None else one.replace(seed=(one.seed + i) % 2**63) for i in range(count)
    ]


def _best(params: SamplingParams, outs: list[RequestOutput]) -> RequestOutput:
    """One prompt's output: its best ``n`` completions (all of them, in order, without best_of).

    NOTE: ranking reads the chosen tokens' log-probabilities, which ``_children`` asks for when the params did
    not; then the user sees neither them nor their sum (vLLM: ``cumulative_logprob`` is None whenever
    ``logprobs`` was not requested)."""
    if len(outs) > params.n:
        outs = sorted(outs, key=lambda o: o.cumulative_logprob, reverse=True)[: params.n]
    shown = params.logprobs is not None
    completions = [
        CompletionOutput(
            i,
            o.text,
            o.token_ids,
            o.cumulative_logprob if shown else None,
            o.logprobs if shown else None,
            o.finish_reason,
            o.stop_reason,
        )
        for i, o in enumerate(outs)
    ]
    spec = SpecMetrics.total(o.spec_metrics for o in outs)
    first = completions[0]
    return dataclasses.replace(
        outs[0],
        text=first.text,
        token_ids=first.token_ids,
        logprobs=first.logprobs,
        cumulative_logprob=first.cumulative_logprob,
        spec_metrics=spec,
        outputs=completions,
    )


def _decode_logprobs(tokenizer, outputs: list[RequestOutput]) -> None:
    """Fill ``decoded_token`` of every Logprob the outputs hold (chosen and top tokens, of the output and of the
    prompt): nothing when no log-probabilities were asked for, or without a tokenizer (vLLM leaves them None
    then); each distinct id is decoded once, for all of them.

    As vLLM: a token's text is ``tokenizer.decode([token_id])`` alone, with the tokenizer's default
    ``skip_special_tokens`` (vllm/tokenizers/detokenizer_utils.py ``convert_ids_list_to_tokens``, which
    vllm/v1/engine/logprobs.py applies to sample and prompt logprobs), not the raw vocabulary piece of
    ``convert_ids_to_tokens`` (``Ġthe``). vLLM's repair of a lone byte token's U+FFFD from its neighbours
    (``LogprobsProcessor._verify_tokens``) is not copied: such a token's text is its U+FFFD."""
    entries = [
        entry
        for out in outputs
        for positions in [out.prompt_logprobs or [], *(c.logprobs or [] for c in out.outputs)]
        for entry in positions
        if entry is not None
    ]
    if tokenizer is None or not entries:
        return
    texts: dict[int, str] = {}
    for entry in entries:
        for token_id, logprob in entry.items():
            if token_id not in texts:
                texts[token_id] = tokenizer.decode([token_id])
            logprob.decoded_token = texts[token_id]
