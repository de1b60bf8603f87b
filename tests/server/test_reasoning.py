"""``--reasoning-parser`` (server/reasoning.py): a chat's thinking split from its answer, where the prompt or the
output opens the block, ended by </think> or Kimi-K2's tool-call section, whole and in streamed pieces."""

import random

import pytest

from outpace.server.reasoning import REASONING_FORMATS, ReasoningStream, reasoning_format

QWEN3 = reasoning_format("qwen3")
OPENED = (
    "<|im_start|>assistant\n<think>\n"  # a template that opens the block (DeepSeek-R1-0528, V3.1)
)
CLOSED = "<|im_start|>assistant\n<think>\n\n</think>\n\n"  # Qwen3 with enable_thinking false
PLAIN = "<|im_start|>assistant\n"  # the model opens the block itself, or not


@pytest.mark.parametrize(
    "prompt, text, want",
    [
        (OPENED, "two plus two\n</think>\n\nFour.", ("two plus two\n", "\n\nFour.")),
        (OPENED, "still thinking", ("still thinking", None)),  # cut off inside the block
        (OPENED, "done</think>", ("done", "")),
        (PLAIN, "<think>\nhm\n</think>\n\nYes.", ("\nhm\n", "\n\nYes.")),
        (PLAIN, "\n <think>hm</think>Yes.", ("hm", "Yes.")),  # white space before the tag
        (PLAIN, "Yes.", (None, "Yes.")),
        (PLAIN, "Yes. <think>not a block</think>", (None, "Yes. <think>not a block</think>")),
        (CLOSED, "Four.", (None, "Four.")),
        (CLOSED, "a</think>b", (None, "a</think>b")),
    ],
)
def test_the_block_starts_where_the_prompt_or_the_output_opens_it(prompt, text, want):
    assert QWEN3.split(text, QWEN3.starts_inside(prompt)) == want


def test_kimi_k2_thinking_ends_where_a_tool_call_section_begins():
    kimi = reasoning_format("kimi_k2")
    text = "<think>look it up<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0"
    assert kimi.split(text, False) == (
        "look it up",
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0",
    )
    assert QWEN3.split(text, False) == (text.removeprefix("<think>"), None)
    singular = text.replace("tool_calls_section", "tool_call_section")  # (the K2 report's spelling)
    assert kimi.split(singular, False) == (
        "look it up",
        "<|tool_call_section_begin|><|tool_call_begin|>functions.f:0",
    )


def test_step3p5_drops_one_newline_on_each_side_of_the_end():
    step = reasoning_format("step-3p5".replace("-", ""))
    assert step.split("a\n\n</think>\n\nb", True) == ("a\n", "\nb")
    assert QWEN3.split("a\n\n</think>\n\nb", True) == ("a\n\n", "\n\nb")


def test_gemma4_thinks_in_its_thought_channel():
    gemma = reasoning_format("gemma4")
    prompt = "<|turn>model\n"
    text = "<|channel>thought\nThe sum is 4.<channel|>Four."
    assert gemma.split(text, gemma.starts_inside(prompt)) == ("The sum is 4.", "Four.")
    call = "<|channel>thought\nUse the tool.<|tool_call>call:f{}<tool_call|>"
    assert gemma.split(call, False) == ("Use the tool.", "<|tool_call>call:f{}<tool_call|>")
    assert gemma.split("Four.", False) == (None, "Four.")


def test_an_unknown_parser_is_refused_by_its_flag():
    with pytest.raises(ValueError, match="--reasoning-parser 'r1'.*deepseek_r1"):
        reasoning_format("r1")
    assert reasoning_format("deepseek-r1") is REASONING_FORMATS["deepseek_r1"]


TEXTS = [
    "two plus two\n</think>\n\nFour.",
    "<think>\nhm, <thin</think> </think>\n\nYes.",
    "  <think>a\n\n</think>\nb",
    "<thinkX>no</think>",
    "think</thi",
    "r<|tool_calls_section_begin|><|tool_call_begin|>x",
    "\n\n",
    "",
    "<|channel>thought\nhm<channel|>Yes.",
    "<|channel>thou",
    "r<|tool_call>call:f{}<tool_call|>",
]


@pytest.mark.parametrize("name", sorted(REASONING_FORMATS))
@pytest.mark.parametrize("prompt", [OPENED, PLAIN])
def test_streamed_pieces_add_up_to_the_whole_split(name, prompt):
    """For any cut of the text into deltas, the reasoning and content deltas concatenate to ``split`` of
    the whole: nothing is sent that a later marker would take back."""
    fmt, rng = REASONING_FORMATS[name], random.Random(0)
    for text in TEXTS:
        reasoning, content = fmt.split(text, fmt.starts_inside(prompt))
        for _ in range(30):
            cuts = sorted(rng.sample(range(len(text) + 1), min(len(text) + 1, rng.randint(0, 6))))
            pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
            stream, got = ReasoningStream(fmt, prompt), ["", ""]
            for i, piece in enumerate(pieces):
                r, c = stream.feed(piece, final=i == len(pieces) - 1)
                got[0] += r
                got[1] += c
            assert got == [reasoning or "", content or ""], (name, text, pieces)


def test_a_stream_keeps_only_what_may_begin_a_marker():
    """Each delta costs its own length: the thinking sent is not kept (a long reasoning would otherwise be
    scanned again at every token)."""
    stream = ReasoningStream(QWEN3, OPENED)
    for _ in range(2000):
        reasoning, content = stream.feed("step </", final=False)
        assert reasoning and not content and len(stream.held) <= len("</think>")
    assert stream.feed("think>done", final=True) == ("", "done")
