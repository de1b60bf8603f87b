"""`outpace serve` refuses an address it cannot listen on before it loads the model (issue 42 item 9)."""

import socket

import pytest

import outpace.server.app
from outpace.cli import main


@pytest.fixture
def no_server_start(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError(
            "the server started (and loaded the model) before the address was checked"
        )

    monkeypatch.setattr(outpace.server.app, "run_server", refuse)


def test_a_port_out_of_range_is_refused(no_server_start, llama_dir, capsys):
    with pytest.raises(SystemExit) as e:
        main(["serve", str(llama_dir), "--port", "70000"])
    assert e.value.code == 2  # argparse's usage error
    assert "argument --port: 70000 is not a TCP port (1 to 65535)" in capsys.readouterr().err


def test_a_port_in_use_is_refused_before_the_model_loads(no_server_start, llama_dir):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(SystemExit) as e:
            main(["serve", str(llama_dir), "--device", "cpu", "--port", str(port)])
    assert str(e.value.code).startswith(
        f"error: --host 127.0.0.1 --port {port}: cannot listen there"
    )


def test_vllms_auto_tool_choice_flag_needs_a_tool_call_parser(
    no_server_start, llama_dir, monkeypatch
):
    """vLLM's `--enable-auto-tool-choice --tool-call-parser NAME` command lines serve; the flag alone is refused
    by name, before the model loads."""
    with pytest.raises(SystemExit) as e:
        main(["serve", str(llama_dir), "--enable-auto-tool-choice"])
    assert str(e.value.code) == (
        "error: --enable-auto-tool-choice needs --tool-call-parser (the model's call format)"
    )
    started = {}
    monkeypatch.setattr(outpace.server.app, "run_server", lambda config, **kw: started.update(kw))
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = str(free.getsockname()[1])
    flags = ["--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
    main(["serve", str(llama_dir), "--device", "cpu", "--port", port, *flags])
    assert started["tool_call_parser"] == "hermes"


def test_vllms_chat_template_flag_takes_a_file_or_a_template(
    no_server_start, llama_dir, monkeypatch, tmp_path
):
    """vLLM's `--chat-template FILE` (or the template itself, told apart by a '{', '}' or newline in it) was an
    unknown flag; a file that cannot be opened and a template that does not parse are named before the model
    loads."""
    started = {}
    monkeypatch.setattr(outpace.server.app, "run_server", lambda config, **kw: started.update(kw))
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = str(free.getsockname()[1])
    serve = ["serve", str(llama_dir), "--device", "cpu", "--port", port]
    file = tmp_path / "template.jinja"
    file.write_text("{{ messages[0]['content'] }}")
    for given in (str(file), "{{ messages[0]['content'] }}"):
        main([*serve, "--chat-template", given])
        assert started["chat_template"] == "{{ messages[0]['content'] }}"
    main(serve)
    assert started["chat_template"] is None
    missing = str(tmp_path / "missing.jinja")
    with pytest.raises(SystemExit) as e:
        main([*serve, "--chat-template", missing])
    assert str(e.value.code).startswith(
        f"error: --chat-template {missing!r} is invalid: no such template file"
    )
    with pytest.raises(SystemExit) as e:
        main([*serve, "--chat-template", "{% for m in messages %}"])
    assert "error: --chat-template '{% for m in messages %}' is not a valid chat template" in str(
        e.value.code
    )
