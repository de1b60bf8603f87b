"""One preparation of chat messages for the template (outpace/chat_messages.py), shared by ``LLM.chat`` and the
server: the same messages reach the template from both (they were two copies that disagreed: the offline API left
a tool call's JSON arguments as text, and None fields in), and the offline side needs no pydantic."""

import subprocess
import sys

import pytest

pytest.importorskip("pydantic")

from outpace.engine.llm import _template_messages  # noqa: E402
from outpace.server.protocol import APIError, ChatMessage, conversation  # noqa: E402

MESSAGES = [
    {
        "role": "developer",
        "content": [{"type": "text", "text": "be "}, {"type": "text", "text": "brief"}],
    },
    {"role": "user", "content": "weather in Paris?", "name": "ann"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny", "name": None},
    {"role": "assistant", "content": "Sunny.", "tool_calls": []},
]
EXPECTED = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "weather in Paris?", "name": "ann"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
            }
        ],
    },
    {"role": "tool", "content": "sunny", "tool_call_id": "call_1"},
    {"role": "assistant", "content": "Sunny."},
]


def server_messages(messages):
    return conversation([ChatMessage.model_validate(m) for m in messages])


def test_the_offline_api_and_the_server_give_the_template_the_same_messages():
    assert server_messages(MESSAGES) == EXPECTED
    assert _template_messages(0, MESSAGES) == EXPECTED


def test_refusals_name_the_field_in_both():
    cases = {
        "messages.0.content.1": [
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image"}]}
        ],
        "messages.0.content.0.text": [{"role": "user", "content": [{"type": "text"}]}],
        "messages.1.tool_calls.0.function.arguments": [
            {"role": "user", "content": "hi"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "[1]"}}],
            },
        ],
    }
    for param, messages in cases.items():
        with pytest.raises(APIError) as e:
            server_messages(messages)
        assert e.value.param == param
        where = param.split(".")
        with pytest.raises(ValueError, match=f"conversation 3 message {where[1]} "):
            _template_messages(3, messages)


def test_the_offline_api_imports_without_pydantic():
    code = "import sys; sys.modules['pydantic'] = None; import outpace.engine.llm, outpace.chat_messages"
    subprocess.run([sys.executable, "-c", code], check=True)
