"""One preparation of chat messages for the template (outpace/chat_messages.py), shared by ``LLM.chat`` and the
server: the same messages reach the template from both (they were two copies that disagreed: the offline API left
a tool call's JSON arguments as text, and None fields in), and the offline side needs no pydantic."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("pydantic")
pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from outpace.chat_messages import content_format, template_messages  # noqa: E402
from outpace.config import EngineConfig  # noqa: E402
from outpace.engine.llm import _template_messages  # noqa: E402
from outpace.server.app import build_app  # noqa: E402
from outpace.server.protocol import APIError, ChatMessage, conversation  # noqa: E402

TINYPY = Path(__file__).resolve().parents[2] / "zoo" / "tinypy"

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
    {
        "role": "system",
        "content": "be \nbrief",
    },  # text parts joined with newlines, as vLLM joins them
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


def test_text_parts_are_joined_with_newlines_as_vllm_joins_them():
    """vLLM's content format "string" (chat_utils.py ``_parse_chat_message_content_parts``: "\\n".join(texts));
    the parts were joined with nothing, so that the same request was another prompt than vLLM's."""
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    messages = [{"role": "user", "content": parts}]
    assert server_messages(messages)[0]["content"] == "a\nb"
    assert _template_messages(0, messages)[0]["content"] == "a\nb"


LOOPS_OVER_CONTENT = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{% for part in m['content'] %}[{{ part['text'] }}]"
    "{% endfor %}<|endoftext|>\n{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


@pytest.mark.parametrize(
    "template, expected",
    [
        ("{% for m in messages %}{{ m['content'] }}{% endfor %}", "string"),
        (LOOPS_OVER_CONTENT, "openai"),
        (
            "{% for m in messages %}{% for c in m.content | list %}{{ c.text }}{% endfor %}{% endfor %}",
            "openai",
        ),
        (
            "{% set rest = messages[1:] %}{% for m in rest %}{% if m.content is string %}{{ m.content }}"
            "{% else %}{% for c in m.content %}{{ c.text }}{% endfor %}{% endif %}{% endfor %}",
            "openai",
        ),
        ("{% for m in messages %}{% for x in m.tool_calls %}{% endfor %}{% endfor %}", "string"),
        ("{% for m in messages %", "string"),  # (its error comes when it is applied)
    ],
    ids=["string", "loop", "filtered-loop", "aliased-loop", "other-loop", "no-parse"],
)
def test_content_format_is_detected_as_vllm_detects_it(template, expected):
    assert content_format(template) == expected


def test_openai_content_format_passes_the_parts():
    messages = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": None},
        {"role": "tool", "content": [{"type": "text", "text": "c"}, {"type": "text", "text": "d"}]},
    ]
    assert [m["content"] for m in template_messages(messages, "openai")] == [
        [{"type": "text", "text": "s"}],
        [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
        [],
        "c\nd",  # (a tool's text parts as one string, as vLLM normalizes them)
    ]


def tinypy_with_template(out: Path, template: str | None) -> str:
    """tinypy (its files linked) with ``template`` as tokenizer_config.json's chat_template (None: none)."""
    out.mkdir(exist_ok=True)
    for f in TINYPY.iterdir():
        (out / f.name).symlink_to(f)
    config = json.loads((TINYPY / "tokenizer_config.json").read_text())
    config.pop("chat_template")
    if template is not None:
        config["chat_template"] = template
    (out / "tokenizer_config.json").unlink()
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    return str(out)


def serve(model_dir: str) -> TestClient:
    config = EngineConfig(
        model_dir, device="cpu", dtype="float32", num_kv_blocks=64, max_num_seqs=2
    )
    return TestClient(build_app(config, log_interval=1e9), raise_server_exceptions=False)


def test_a_template_that_loops_over_content_reads_the_parts_of_every_message(tmp_path):
    """vLLM's content format "openai" for such a template (Gemma 3's, Llama 4's, Mistral's): a message's content
    as its list of parts, a string content as one part. Given the string, the template looped over its
    characters and rendered no text at all."""
    with serve(tinypy_with_template(tmp_path, LOOPS_OVER_CONTENT)) as http:
        parts = [{"type": "text", "text": "hi"}, {"type": "text", "text": "there"}]
        messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": parts}]
        r = http.post("/tokenize", json={"messages": messages})
        assert r.status_code == 200, r.text
        tok = http.app.state.engine.tokenizer
        text = "<|system|>\n[be brief]<|endoftext|>\n<|user|>\n[hi][there]<|endoftext|>\n<|assistant|>\n"
        assert r.json()["tokens"] == tok.encode(text, add_special_tokens=False)


def test_a_chat_to_a_model_without_a_template_names_where_it_looked(tmp_path):
    with serve(tinypy_with_template(tmp_path, None)) as http:
        r = http.post(
            "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]}
        )
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["param"] == "messages", error
        for where in ("chat_template.jinja", "tokenizer_config.json chat_template"):
            assert where in error["message"], error


def test_the_servers_chat_template_renders_in_the_place_of_the_tokenizers(tmp_path):
    """``--chat-template`` (build_app's ``chat_template``), for a model with a template of its own or none."""
    for template in ("{% for m in messages %}{{ m['content'] }}{% endfor %}", None):
        model_dir = tinypy_with_template(tmp_path / str(template is None), template)
        config = EngineConfig(
            model_dir, device="cpu", dtype="float32", num_kv_blocks=64, max_num_seqs=2
        )
        app = build_app(config, log_interval=1e9, chat_template=LOOPS_OVER_CONTENT)
        with TestClient(app) as http:
            r = http.post("/tokenize", json={"messages": [{"role": "user", "content": "hi"}]})
            assert r.status_code == 200, r.text
            tok = http.app.state.engine.tokenizer
            text = "<|user|>\n[hi]<|endoftext|>\n<|assistant|>\n"
            assert r.json()["tokens"] == tok.encode(text, add_special_tokens=False)
