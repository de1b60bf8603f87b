"""``--reasoning-parser``: a reasoning model's thinking, split from its answer (``reasoning_content`` and
``content``, the DeepSeek API's contract that SGLang and vLLM serve), whole and while streaming.

The thinking of every family served here sits between ``<think>`` and ``</think>`` (vLLM's and SGLang's
parsers of these names; vllm/reasoning/*_reasoning_parser.py, sglang/srt/parser/reasoning_parser.py). Where it
starts is what the parsers of those servers guess at per model, and what the prompt says here: chat templates
open the block themselves (DeepSeek-R1-0528, DeepSeek-V3.1 ``thinking``, Qwen3's thinking models), close it
empty to turn thinking off (Qwen3 ``enable_thinking: false``, Nemotron 3, DeepSeek-V3.1 without ``thinking``),
or leave the model to write ``<think>`` first (Qwen3, Kimi-K2-Thinking). So the output starts inside the
block when the prompt's last ``<think>`` is not closed; otherwise a ``<think>`` that opens the output (after
white space) starts one. The block ends at ``</think>`` or, for Kimi-K2, where a tool-call section begins
(vLLM's kimi_k2 parser: that marker stays in the content, for the tool-call parser); an output that ends
inside the block is all reasoning, its content None (vLLM's deepseek_r1). Step-3.5-Flash writes a newline on
each side of ``</think>``, which is dropped (vLLM's step3p5 parser).
"""

from __future__ import annotations

from dataclasses import dataclass

THINK_START, THINK_END = "<think>", "</think>"


@dataclass(frozen=True)
class ThinkingFormat:
    name: str
    implicit_ends: tuple[str, ...] = ()  # markers that end the block and stay in the content
    trim_newlines: bool = False  # one newline dropped on each side of </think>

    def ended_in(self, prompt: str) -> bool:
        """Whether the prompt ends thinking (its last tag a </think>: thinking switched off by the template); if
        not, the output may think first (vLLM's ``is_reasoning_end`` of the prompt)."""
        return prompt.rfind(THINK_END) > prompt.rfind(THINK_START)

    def starts_inside(self, prompt: str) -> bool:
        """Whether the prompt leaves the output inside a thinking block (its last <think> not closed)."""
        return prompt.rfind(THINK_START) > prompt.rfind(THINK_END)

    def split(self, text: str, inside: bool, final: bool = True) -> tuple[str | None, str | None]:
        """(reasoning, content) of ``text``, the output so far; ``inside``: ``starts_inside`` of its prompt.
        Before ``final``, text that could still become part of a marker is held back, so that each result is
        a prefix of the next (``ReasoningStream``)."""
        start = 0
        if text.lstrip().startswith(THINK_START):
            inside, start = True, text.index(THINK_START) + len(THINK_START)
        elif not final and THINK_START.startswith(text.lstrip()):
            return None, None  # white space or part of a <think> tag: not known yet
        elif not inside:
            return None, text
        ends = [(text.find(m, start), m) for m in (THINK_END, *self.implicit_ends)]
        found = [(i, m) for i, m in ends if i >= 0]
        if not found:
            reasoning = text[start:]
            if not final:
                reasoning = reasoning[: len(reasoning) - self._partial_marker(reasoning)]
            return reasoning, None
        i, marker = min(found)
        reasoning, content = text[start:i], text[i:]
        if marker == THINK_END:
            content = content[len(THINK_END) :]
            if self.trim_newlines:
                content = content.removeprefix("\n")
        if self.trim_newlines:
            reasoning = reasoning.removesuffix("\n")
        return reasoning, content

    def _partial_marker(self, reasoning: str) -> int:
        """Characters at the end of ``reasoning`` that could begin a marker ending the block."""
        markers = [THINK_END, *self.implicit_ends] + (
            ["\n" + THINK_END] if self.trim_newlines else []
        )
        longest = 0
        for m in markers:
            for k in range(min(len(m) - 1, len(reasoning)), longest, -1):
                if reasoning.endswith(m[:k]):
                    longest = k
                    break
        return longest


_KIMI_TOOL_SECTION = "<|tool_calls_section_begin|>"  # vllm/reasoning/kimi_k2_reasoning_parser.py
REASONING_FORMATS = {
    f.name: f
    for f in (
        ThinkingFormat("deepseek_r1"),
        ThinkingFormat("deepseek_v3"),
        ThinkingFormat("qwen3"),
        ThinkingFormat("nemotron_v3"),
        ThinkingFormat("kimi_k2", implicit_ends=(_KIMI_TOOL_SECTION,)),
        ThinkingFormat("step3p5", trim_newlines=True),
    )
}


def reasoning_format(name: str) -> ThinkingFormat:
    """The format of ``--reasoning-parser NAME`` (SGLang's spelling with dashes too)."""
    found = REASONING_FORMATS.get(name.replace("-", "_"))
    if found is None:
        known = ", ".join(sorted(REASONING_FORMATS))
        raise ValueError(f"--reasoning-parser {name!r} is not known (one of: {known})")
    return found


class ReasoningStream:
    """One streamed choice's text deltas split into (reasoning, content) deltas: concatenated, they are what
    ``split`` gives the whole text."""

    def __init__(self, fmt: ThinkingFormat, prompt: str) -> None:
        self.fmt, self.inside = fmt, fmt.starts_inside(prompt)
        self.text, self.sent_reasoning, self.sent_content = "", 0, 0

    def feed(self, delta: str, final: bool) -> tuple[str, str]:
        self.text += delta
        reasoning, content = self.fmt.split(self.text, self.inside, final)
        reasoning, content = reasoning or "", content or ""
        out = reasoning[self.sent_reasoning :], content[self.sent_content :]
        self.sent_reasoning, self.sent_content = len(reasoning), len(content)
        return out
