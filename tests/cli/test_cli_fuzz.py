"""Bad flags, values, paths and inputs, as a user of vLLM's CLI and offline API types them: each is refused
naming the flag, field or input, before any heavy work, and none is silently ignored."""

import math
import re

import pytest
import torch

import outpace.bench.decode
import outpace.server.app
import outpace.train.target
from outpace import LLM, SamplingParams
from outpace.cli import main, parse_args
from outpace.config import EngineConfig, SpeculativeConfig
from outpace.validation import ConfigError
from outpace.zoo import default_model, zoo_dir

TARGET = str(default_model())
FLAG = r"(?<![\w-])--[a-z][a-z0-9-]*"


class Reached(AssertionError):
    """The command went on to its heavy work (a model load, a benchmark, a training run)."""


def refuse(*args, **kwargs):
    raise Reached("the command went on past its arguments")


def error_of(argv: list[str]) -> str:
    """The one-line error a command exits with."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert isinstance(e.value.code, str) and e.value.code.startswith("error: "), e.value.code
    return e.value.code


@pytest.fixture(scope="module")
def llm():
    with LLM(TARGET, device="cpu", num_kv_blocks=16) as llm:
        yield llm


ONE_TOKEN = SamplingParams(max_tokens=1)


def test_generate_refuses_prompts_that_are_neither_text_nor_token_ids(llm):
    """bytes were read as token ids (b"abc" -> [97, 98, 99]) and generated for; the other shapes failed deep
    inside with a TypeError or a KeyError naming no prompt."""
    refusals = {
        "prompts is a bytes": b"abc",
        "prompts is a int": 5,
        "prompts is a NoneType": None,
        "prompts is a dict": {"prompt": "x"},
        "prompt 1 is a NoneType": ["x", None],
        "prompt 0 is a dict": [{"prompt_token_ids": [1, 2]}],
        "prompt 1 is a bytes": ["x", b"y"],
    }
    for message, prompts in refusals.items():
        with pytest.raises(TypeError, match=message):
            llm.generate(prompts, ONE_TOKEN)
    # what a prompt may be: text, token ids (a tuple too), a list mixing them
    outs = llm.generate(["x", [5, 6], (7,)], ONE_TOKEN)
    assert [o.prompt_token_ids[-1] for o in outs[1:]] == [6, 7]


def test_generate_refuses_params_that_are_not_sampling_params(llm):
    """A dict, a None in a list or a generator failed with an AttributeError on 'best_of'."""
    for params in ({"max_tokens": 1}, [None], (p for p in [ONE_TOKEN])):
        with pytest.raises(TypeError, match="params 0 is a .*: params must be SamplingParams"):
            llm.generate("x", params)


def test_chat_takes_openai_text_parts_and_the_developer_role(llm):
    """OpenAI's content parts and the developer role, which the server takes, reached the template as they
    were (a TypeError inside the template; 'unknown chat role: developer')."""
    plain = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi\nthere"}]
    parts = [  # (text parts joined with newlines, as vLLM joins them)
        {"role": "developer", "content": [{"type": "text", "text": "be brief"}]},
        {
            "role": "user",
            "content": [{"type": "text", "text": "hi"}, {"type": "text", "text": "there"}],
        },
    ]
    ids = [llm.chat(c, ONE_TOKEN)[0].prompt_token_ids for c in (plain, parts)]
    assert ids[0] == ids[1]
    image = {"type": "image_url", "image_url": {"url": "data:"}}
    with pytest.raises(
        ValueError, match=r"conversation 0 message 0 content part 1 \('image_url'\)"
    ):
        llm.chat([{"role": "user", "content": [{"type": "text", "text": "a"}, image]}], ONE_TOKEN)
    with pytest.raises(ValueError, match="conversation 0 message 0: content must be .* not a int"):
        llm.chat([{"role": "user", "content": 3}], ONE_TOKEN)
    with pytest.raises(TypeError, match="messages is a dict"):  # was KeyError: 0
        llm.chat({"role": "user", "content": "hi"}, ONE_TOKEN)


def test_engine_config_refuses_a_device_seed_or_timeout_of_the_wrong_kind():
    """device=None raised an AttributeError, seed=True and seed=2**64 torch's errors at start-up, and a
    dist_timeout of inf or one past int64 nanoseconds a traceback (or a timeout already past) in the ranks;
    max_model_len=1 started an engine that refused every prompt."""
    refusals = {
        "device=None": dict(device=None),
        "seed=True": dict(seed=True),
        "seed=18446744073709551616": dict(seed=2**64),
        "dist_timeout=inf": dict(dist_timeout=math.inf),
        "dist_timeout=1000000000000000.0": dict(dist_timeout=1e15),
        "max_model_len=1": dict(max_model_len=1),
    }
    for message, kwargs in refusals.items():
        with pytest.raises(ConfigError, match=f"EngineConfig.{message} is invalid"):
            EngineConfig(model=TARGET, **{"device": "cpu", **kwargs})
    assert EngineConfig(model=TARGET, device="cpu", dist_timeout=10**9).dist_timeout == 10**9


def test_serve_refuses_an_empty_api_key_or_name_and_a_negative_drain_timeout(monkeypatch):
    """--api-key "" (an unset shell variable) served with no key at all, --served-model-name "" fell back to
    the directory's name and --drain-timeout -1 aborted every request at shutdown."""
    monkeypatch.setattr(outpace.server.app, "run_server", refuse)
    serve = ["serve", TARGET, "--device", "cpu"]
    assert (
        error_of([*serve, "--api-key", ""])
        == "error: --api-key is empty: give a value, or leave the flag out"
    )
    assert "--served-model-name is empty" in error_of([*serve, "--served-model-name", ""])
    assert "--drain-timeout -1 is invalid" in error_of([*serve, "--drain-timeout", "-1"])


def test_bench_refuses_the_flags_of_other_benches(monkeypatch):
    """Only --batch-sizes was refused where it was not read: bench speed ran at temperature 0 with
    --temperature 0.5, bench acceptance ignored --method, bench cpu --device cuda ran on the CPU."""
    monkeypatch.setattr(outpace.bench.decode, "run_decode_bench", refuse)
    refusals = {
        "--temperature applies to bench serve and serve --sweep, not bench speed": [
            "--temperature",
            "0.5",
        ],
        "--method applies to bench speed, not bench acceptance": [
            "acceptance",
            "--method",
            "ngram",
        ],
        "--device applies to bench speed, acceptance and serve --sweep, not bench cpu": [
            "cpu",
            "--device",
            "cuda",
        ],
        "--tensor-parallel-size applies to bench speed, acceptance and cpu, not bench serve": [
            "serve",
            "--tp",
            "2",
        ],
        "--url applies to bench serve, not bench serve --sweep": [
            "serve",
            "--sweep",
            "--url",
            "http://x",
        ],
        "--sweep applies to bench serve and serve --sweep, not bench speed": ["--sweep"],
        "--model applies to bench speed, acceptance and cpu, not bench gpu": [
            "gpu",
            "--model",
            TARGET,
        ],
    }
    for message, flags in refusals.items():
        assert message in error_of(["bench", *flags])
    with pytest.raises(Reached):  # the flags bench speed reads pass
        main(
            [
                "bench",
                "--device",
                "cpu",
                "--method",
                "ngram",
                "--batch-sizes",
                "2",
                "--max-tokens",
                "8",
            ]
        )


def test_bench_counts_must_be_positive(capsys):
    """--batch-sizes 0 ran into a ZeroDivisionError and bench cpu --rounds 0 into 'no median for empty
    data', after loading the models; bench serve --concurrency 0 named 'client_processes'."""
    for flags in (
        ["--batch-sizes", "0"],
        ["--max-tokens", "-1"],
        ["cpu", "--rounds", "0"],
        ["cpu", "--busy", "-1"],
        ["serve", "--concurrency", "0"],
        ["serve", "--num-requests", "0"],
    ):
        with pytest.raises(SystemExit) as e:
            parse_args(["bench", *flags])
        assert e.value.code == 2  # argparse's usage error
        assert f"argument {flags[-2]}: {flags[-1]} is invalid: must be an integer >=" in (
            capsys.readouterr().err
        )


def test_bench_serve_names_the_url_without_a_server_and_a_missing_prompts_file(tmp_path):
    """Both were tracebacks (httpx.ConnectError; a FileNotFoundError naming no flag)."""
    url = "http://127.0.0.1:1"
    bench = ["bench", "serve", "--url", url, "--num-requests", "1"]
    assert error_of(bench).startswith(f"error: --url {url}: ")
    missing = tmp_path / "prompts.json"
    assert (
        error_of([*bench, "--prompts", str(missing)]) == f"error: --prompts {missing}: no such file"
    )


def test_train_refuses_a_device_it_cannot_use_before_making_data(monkeypatch, tmp_path):
    """train target --device gpu (or cuda on a machine without one, the default) prepared the data for half
    a minute, then failed with torch's traceback."""
    monkeypatch.setattr(outpace.train.target, "prepare_data", refuse)
    monkeypatch.setattr(outpace.train.target, "train_target", refuse)
    out = ["--out", str(tmp_path / "out"), "--toy"]
    message = "error: --device 'gpu' is invalid: must be cpu, cuda or cuda:N"
    assert error_of(["train", "target", *out, "--device", "gpu"]) == message
    assert error_of(["train", "draft", "--method", "eagle3", *out, "--device", "gpu"]) == message
    if not torch.cuda.is_available():
        assert "--device cuda: torch" in error_of(["train", "target", *out])
    assert "--device cuda:99: torch" in error_of(["train", "target", *out, "--device", "cuda:99"])


def test_token_map_refuses_an_out_it_cannot_write_before_counting(tmp_path):
    """--out naming a directory, or a file in a missing one, failed in torch.save after the counting."""
    text = tmp_path / "text.txt"
    text.write_text("def f(x):\n    return x\n")
    token_map = [
        "token-map",
        str(zoo_dir() / "tinypy"),
        "--text",
        str(text),
        "--size",
        "8",
        "--out",
    ]
    assert "is a directory" in error_of([*token_map, str(tmp_path)])
    missing = tmp_path / "missing" / "map.pt"
    assert f"no directory {missing.parent}" in error_of([*token_map, str(missing)])


@pytest.mark.parametrize("command", ["generate", "serve", "bench", "token-map"])
def test_help_names_only_flags_the_command_takes(command, capsys, monkeypatch):
    """generate's and bench's --help gave --max-num-seqs as the default of --cuda-graph-sizes and
    --num-state-checkpoints: only serve takes it."""
    monkeypatch.setenv("COLUMNS", "1000")  # (no flag cut at a line's end)
    with pytest.raises(SystemExit):
        main([command, "--help"])
    lines = capsys.readouterr().out.splitlines()
    # each option's line: its spellings, then (past two spaces) its help
    taken = {
        flag
        for line in lines
        if line.startswith("  -")
        for flag in re.findall(FLAG, line.strip().split("  ")[0])
    }
    named = set(re.findall(FLAG, "\n".join(lines))) - {"--nproc-per-node"}  # (torchrun's)
    assert named - taken == set()


def test_token_map_names_a_text_file_that_is_not_utf8(tmp_path):
    """A --text file that is not UTF-8 ended the command with the codec's message alone, naming no file."""
    plain, lines = tmp_path / "latin1.txt", tmp_path / "records.jsonl"
    plain.write_bytes("caf\xe9\n".encode("latin-1"))
    lines.write_bytes(b'{"text": "def f(): pass"}\n{"text": "caf\xe9"}\n')
    token_map = ["token-map", str(zoo_dir() / "tinypy"), "--size", "8", "--out"]
    out = str(tmp_path / "map.pt")
    assert error_of([*token_map, out, "--text", str(plain)]).startswith(
        f"error: --text {plain}: not UTF-8 text ("
    )
    assert error_of([*token_map, out, "--text", str(lines)]).startswith(
        f"error: --text {lines}: line 2 is not UTF-8 text ("
    )


def test_bench_serve_names_a_prompts_file_that_holds_no_prompts(tmp_path):
    """--prompts with invalid JSON ended with json's message alone, naming no file; an object without
    "prompts" with a KeyError traceback."""
    for name, text, cause in (
        ("bad.json", "{bad", "JSONDecodeError"),
        ("object.json", '{"x": 1}', "KeyError"),
        ("number.json", "5", "TypeError"),
    ):
        path = tmp_path / name
        path.write_text(text)
        error = error_of(["bench", "serve", "--url", "http://127.0.0.1:1", "--prompts", str(path)])
        assert error.startswith(f"error: --prompts {path}: not a JSON list of prompts"), error
        assert f"({cause}: " in error


@pytest.mark.parametrize(
    "serve_args, problem",
    [
        ('"--num-kv-blocks 4', "No closing quotation"),
        ("--bogus 4", "unrecognized arguments: --bogus"),
        ("--num-kv-blocks x", "argument --num-kv-blocks: invalid int value: 'x'"),
    ],
)
def test_bench_serve_sweep_refuses_serve_args_before_any_server_starts(
    serve_args, problem, monkeypatch, capsys
):
    """An unclosed quote ended with shlex's message alone; a flag `outpace serve` refuses started a server per
    method, each ending in a RuntimeError traceback with the refusal in its log."""
    import outpace.bench.serve_sweep as serve_sweep

    def refuse(*args, **kwargs):
        raise AssertionError("a server started before --serve-args was checked")

    monkeypatch.setattr(serve_sweep, "run_serve_sweep", refuse)
    error = error_of(
        ["bench", "serve", "--sweep", "--model-dir", str(zoo_dir()), "--serve-args", serve_args]
    )
    assert error.startswith(f"error: --serve-args {serve_args!r}: "), error
    assert problem in error
    assert capsys.readouterr().err == ""  # (the usage of serve's parser is not printed)


@pytest.mark.parametrize(
    "flags, error",
    [
        (["multi", "--time-limit", "0"], "--time-limit 0.0 is invalid: must be"),
        (["multi", "--time-limit", "-5"], "--time-limit -5.0 is invalid: must be"),
        (["gpu", "--time-limit", "nan"], "--time-limit nan is invalid: must be"),
        (["multi", "--dp-reserve", "-1"], "--dp-reserve -1.0 is invalid: must be"),
    ],
)
def test_bench_seconds_must_be_finite_and_positive(flags, error):
    """bench multi took --time-limit 0 (and --dp-reserve 0) for "not given", and ran with its default; a
    negative limit reached the run."""
    assert error_of(["bench", *flags]).startswith(f"error: {error}")


def test_bench_multi_takes_a_dp_reserve_of_0():
    from outpace.cli.bench import multi_plan

    assert multi_plan(parse_args(["bench", "multi", "--dp-reserve", "0"])).dp_reserve_s == 0


def test_bench_gpu_without_a_gpu_is_one_line(monkeypatch):
    """bench gpu on a machine without a GPU ended in torch's AssertionError traceback."""
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    assert error_of(["bench", "gpu"]).startswith("error: bench gpu runs on a GPU, and torch ")


def test_train_refuses_a_set_field_that_a_flag_also_sets(monkeypatch, tmp_path):
    """--steps 3 --set steps=5 trained 5 steps: --set silently won over the named flag."""
    import outpace.train.ranks

    def refuse(*args, **kwargs):
        raise AssertionError("training started")

    monkeypatch.setattr(outpace.train.target, "train_target", refuse)
    monkeypatch.setattr(outpace.train.ranks, "train_on_ranks", refuse)
    common = ["--out", str(tmp_path), "--device", "cpu", "--toy"]
    assert error_of(["train", "target", *common, "--steps", "3", "--set", "steps=5"]) == (
        "error: --set steps=5 and --steps both set the recipe's steps: give one"
    )
    draft = ["train", "draft", "--method", "mtp", *common, "--data", "a.txt"]
    assert error_of([*draft, "--set", "prompt_files=[]"]).startswith(
        "error: --set prompt_files=() and --data both set"
    )


def test_bench_serve_refuses_a_temperature_and_device_no_request_or_server_takes(monkeypatch):
    """--temperature -1 had every request answered 400 (--sweep then ended in matplotlib's "Data cannot be
    log-scaled"); --sweep --device banana, in a RuntimeError traceback per server, the refusal in its log."""
    import outpace.bench.serve_sweep as serve_sweep

    def refuse(*args, **kwargs):
        raise AssertionError("a server started before the flags were checked")

    monkeypatch.setattr(serve_sweep, "run_serve_sweep", refuse)
    sweep = ["bench", "serve", "--sweep", "--model-dir", str(zoo_dir())]
    assert error_of([*sweep, "--temperature", "-1"]) == (
        "error: --temperature -1.0 is invalid: must be a finite number >= 0"
    )
    assert error_of(["bench", "serve", "--url", "http://127.0.0.1:1", "--temperature", "nan"]) == (
        "error: --temperature nan is invalid: must be a finite number >= 0"
    )
    assert error_of([*sweep, "--device", "banana"]) == (
        "error: --device 'banana' is invalid: must be auto, cpu or cuda[:N]"
    )


def test_bench_serve_sweep_ends_with_the_error_of_a_server_that_exited(monkeypatch):
    import outpace.bench.serve_sweep as serve_sweep

    def exited(*args, **kwargs):
        raise RuntimeError(
            "the server exited with 1; its log ends:\nerror: EngineConfig.x=1 is invalid"
        )

    monkeypatch.setattr(serve_sweep, "run_serve_sweep", exited)
    error = error_of(["bench", "serve", "--sweep", "--model-dir", str(zoo_dir())])
    assert error == (
        "error: bench serve --sweep: the server exited with 1; its log ends:\n"
        "error: EngineConfig.x=1 is invalid"
    )


def test_bench_serve_sweep_names_a_server_that_served_no_request(monkeypatch, tmp_path):
    """Every request refused (e.g. --serve-args "--num-kv-blocks 1"): the sweep ended in matplotlib's "Data cannot
    be log-scaled" instead of the requests' errors."""
    import outpace.bench.serve_sweep as serve_sweep

    class Server:  # (LocalServer, started: its requests below all fail)
        url = "http://127.0.0.1:1"

        def __init__(self, *args, log_path):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def wait_ready(self, timeout):
            pass

        def check_alive(self):
            pass

    def refused(url, requests, *args, **kwargs):
        return {"num_requests": len(requests), "num_failed": len(requests), "errors": ["HTTP 400"]}

    monkeypatch.setattr(serve_sweep, "LocalServer", Server)
    monkeypatch.setattr(serve_sweep, "run_load", refused)
    monkeypatch.setattr(serve_sweep, "scrape_metrics", lambda url: {})
    argv = ["bench", "serve", "--sweep", "--model-dir", str(zoo_dir()), "--out", str(tmp_path)]
    assert error_of([*argv, "--methods", "none"]) == (
        f"error: bench serve --sweep: none: every request failed (HTTP 400); the server's log: "
        f"{tmp_path / 'serve_none.log'}"
    )


@pytest.mark.parametrize(
    "fields, error",
    [
        (
            dict(draft="d"),
            "SpeculativeConfig.draft='d' is invalid: must be None with method 'none'",
        ),
        (
            dict(method="mtp", ngram_min=1),
            "SpeculativeConfig.ngram_min=1 is invalid: must be left at 2",
        ),
        (
            dict(ngram_max=6),
            "SpeculativeConfig.ngram_max=6 is invalid: must be left at 4 with method",
        ),
    ],
)
def test_speculative_config_refuses_fields_its_method_does_not_read(fields, error):
    """A draft without a drafter and n-gram sizes for another drafter were silently unused (the engine refuses a
    draft for a drafter that loads none: tests/speculative/test_draft_config_refusals.py)."""
    with pytest.raises(ConfigError) as refused:
        SpeculativeConfig(**fields)
    assert str(refused.value).startswith(error), refused.value
