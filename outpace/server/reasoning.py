"""``--reasoning-parser``: a reasoning model's thinking, split from its answer (``reasoning_content`` and
``content``, the DeepSeek API's contract that SGLang and vLLM serve), whole and while streaming.

The thinking of every family served here sits between ``<think>`` and ``</think>`` (vLLM's and SGLang's
parsers of these names; vllm/reasoning/*_reasoning_parser.py, sglang/srt/parser/reasoning_parser.py), Gemma 4's
between ``<|channel>thought\n`` and ``<channel|>`` (what follows says <think> for either). Where it
starts is what the parsers of those servers guess at per model, and what the prompt says here: chat templates
open the block themselves (DeepSeek-R1-0528, DeepSeek-V3.1 ``thinking``, Qwen3's thinking models), close it
empty to turn thinking off (Qwen3 ``enable_thinking: false``, Nemotron 3, DeepSeek-V3.1 without ``thinking``),
or leave the model to write ``<think>`` first (Qwen3, Kimi-K2-Thinking). So the output starts inside the
block when the prompt's last ``<think>`` is not closed; otherwise a ``<think>`` that opens the output (after
white space) starts one. The block ends at ``</think>`` or, for Kimi-K2 and Gemma 4, where a tool call begins
(vLLM's kimi_k2 and gemma4 parsers: that marker stays in the content, for the tool-call parser); an output that ends
inside the block is all reasoning, its content None (vLLM's deepseek_r1). Step-3.5-Flash writes a newline on
each side of ``</think>``, which is dropped (vLLM's step3p5 parser).
"""

from __future__ import annotations

from dataclasses import dataclass

from outpace.server.tool_calls import KIMI_SECTION, KIMI_SECTION_SINGULAR


@dataclass(frozen=True)
class ThinkingFormat:
    name: str
    implicit_ends: tuple[str, ...] = ()  # markers that end the block and stay in the content
    trim_newlines: bool = False  # one newline dropped on each side of the end
    start: str = "<think>"
    end: str = "</think>"

    def ended_in(self, prompt: str) -> bool:
        """Whether the prompt ends thinking (its last tag a </think>: thinking switched off by the template); if
        not, the output may think first (vLLM's ``is_reasoning_end`` of the prompt)."""
        return prompt.rfind(self.end) > prompt.rfind(self.start)

    def starts_inside(self, prompt: str) -> bool:
        """Whether the prompt leaves the output inside a thinking block (its last <think> not closed)."""
        return prompt.rfind(self.start) > prompt.rfind(self.end)

    def split(self, text: str, inside: bool, final: bool = True) -> tuple[str | None, str | None]:
        """(reasoning, content) of ``text``, the output so far; ``inside``: ``starts_inside`` of its prompt.
        Before ``final``, text that could still become part of a marker is held back, so that each result is
        a prefix of the next (``ReasoningStream``)."""
        start = self.block_start(text, inside, final)
        if start is None:
            return None, None
        if start < 0:
            return None, text
        reasoning, content, _ = self.split_block(text[start:], final)
        return reasoning, content

    def block_start(self, text: str, inside: bool, final: bool) -> int | None:
        """Where the thinking in ``text`` starts (past a <think> that opens the output), -1 where there is none;
        None before ``final`` while white space or part of a <think> is all there is."""
        if text.lstrip().startswith(self.start):
            return text.index(self.start) + len(self.start)
        if not final and self.start.startswith(text.lstrip()):
            return None
        return 0 if inside else -1

    def split_block(self, block: str, final: bool) -> tuple[str, str | None, str | None]:
        """(reasoning, content, the marker that ended it) of ``block``, text from the thinking's start on; the
        content None (and no marker) while the block has not ended."""
        ends = [(block.find(m), m) for m in (self.end, *self.implicit_ends)]
        found = [(i, m) for i, m in ends if i >= 0]
        if not found:
            held = 0 if final else self._partial_marker(block)
            return block[: len(block) - held], None, None
        i, marker = min(found)
        reasoning, content = block[:i], block[i:]
        if marker == self.end:
            content = content[len(self.end) :]
            if self.trim_newlines:
                content = content.removeprefix("\n")
        if self.trim_newlines:
            reasoning = reasoning.removesuffix("\n")
        return reasoning, content, marker

    def _partial_marker(self, reasoning: str) -> int:
        """Characters at the end of ``reasoning`` that could begin a marker ending the block."""
        markers = [self.end, *self.implicit_ends] + (
            ["\n" + self.end] if self.trim_newlines else []
        )
        longest = 0
        for m in markers:
            for k in range(min(len(m) - 1, len(reasoning)), longest, -1):
                if reasoning.endswith(m[:k]):
                    longest = k
                    break
        return longest


# where Kimi-K2's tool-call section opens (vllm/reasoning/kimi_k2_reasoning_parser.py: the plural spelling; the
# singular too here, which the tool-call parser also reads: server/tool_calls.py ``_KimiK2``)
_KIMI_TOOL_SECTIONS = (KIMI_SECTION[0], KIMI_SECTION_SINGULAR[0])
REASONING_FORMATS = {
    f.name: f
    for f in (
        ThinkingFormat("deepseek_r1"),
        ThinkingFormat("deepseek_v3"),
        ThinkingFormat("qwen3"),
        ThinkingFormat("nemotron_v3"),
        ThinkingFormat("kimi_k2", implicit_ends=_KIMI_TOOL_SECTIONS),
        ThinkingFormat("step3p5", trim_newlines=True),
        # Gemma 4: "<|channel>thought\n...<channel|>", ended early by a tool call
        # (vllm/reasoning/gemma4_reasoning_parser.py; its "thought\n" label is read here as part of the start)
        ThinkingFormat("gemma4", ("<|tool_call>",), start="<|channel>thought\n", end="<channel|>"),
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
    ``split`` gives the whole text. Each delta costs its own length, not the output's: the thinking sent is
    dropped from what is kept (only a tail that may begin a marker waits)."""

    def __init__(self, fmt: ThinkingFormat, prompt: str) -> None:
        self.fmt, self.inside = fmt, fmt.starts_inside(prompt)
        self.held = ""  # received, not yet sent
        self.phase = "start"  # then "block" (thinking) or "content"
        self.drop_newline = False  # step3p5: the newline after </think> has not come yet

    def feed(self, delta: str, final: bool) -> tuple[str, str]:
        text, self.held = self.held + delta, ""
        if self.phase == "start":
            start = self.fmt.block_start(text, self.inside, final)
            if start is None:
                self.held = text
                return "", ""
            self.phase = "content" if start < 0 else "block"
            text = text if start < 0 else text[start:]
        if self.phase == "content":
            if self.drop_newline and text:
                text, self.drop_newline = text.removeprefix("\n"), False
            return "", text
        reasoning, content, marker = self.fmt.split_block(text, final)
        if content is None:
            self.held = text[len(reasoning) :]
            return reasoning, ""
        self.phase = "content"
        after = text.find(self.fmt.end) + len(self.fmt.end)
        self.drop_newline = self.fmt.trim_newlines and marker == self.fmt.end and after == len(text)
        return reasoning, content
