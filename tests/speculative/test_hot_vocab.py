"""A token map for MTP drafts (``--speculative-token-map``, speculative/hot_vocab.py): the file is checked naming the
flag and the file; a hot head computes the full head's logits at the map's tokens for every MTP layout (the target's
head, DeepSeek-V3's own, Qwen3-Next's normed output, Step-3.5's own zero-centred one); drafting through it proposes
only the map's tokens and commits what plain decoding does; a map of the whole vocabulary in another order drafts
exactly as no map; ``outpace token-map`` ranks a text's tokens. (The sampled case:
tests/speculative/test_lossless_sampling.py's ``mtp-token-map``.)"""

import json
from collections import Counter
from pathlib import Path

import pytest
import torch

from helpers.hybrid_drafting import save_with_mtp
from helpers.spec_models import random_llama
from helpers.step3p5_checkpoints import CONFIG as STEP_CONFIG
from helpers.step3p5_checkpoints import write_checkpoint
from outpace import LLM, SamplingParams
from outpace.cli import parse_args
from outpace.cli.speculative_args import speculative_config
from outpace.config import SpeculativeConfig
from outpace.models.loader import load_model
from outpace.speculative.hot_vocab import HotHead, Readout, load_token_map
from outpace.validation import ConfigError

ZOO = Path(__file__).resolve().parents[2] / "zoo"
VOCAB = 300


def _save(path: Path, ids) -> Path:
    torch.save(ids, path)
    return path


@pytest.mark.parametrize(
    "saved, why",
    [
        ({"ids": [1, 2]}, "not a list or tensor"),
        (torch.ones(2, 3, dtype=torch.int64), "1-D"),
        (torch.tensor([1.0, 2.0]), "1-D list of integer"),
        ([], "non-empty"),
        ([3, VOCAB], f"token id {VOCAB} is outside"),
        ([-1, 4], "token id -1 is outside"),
        ([5, 6, 5], "more than once"),
    ],
)
def test_a_map_that_is_no_map_of_this_vocabulary_is_refused_by_flag_and_file(tmp_path, saved, why):
    path = _save(tmp_path / "map.pt", saved)
    with pytest.raises(ConfigError, match=why) as e:
        load_token_map(path, VOCAB)
    assert f"--speculative-token-map {path}" in str(e.value)


def test_a_file_torch_cannot_read_or_that_is_missing_is_refused(tmp_path):
    (tmp_path / "map.txt").write_text("1 2 3\n")
    with pytest.raises(ConfigError, match="not a token map saved by torch.save"):
        load_token_map(tmp_path / "map.txt", VOCAB)
    with pytest.raises(ConfigError, match="no such file"):
        load_token_map(tmp_path / "absent.pt", VOCAB)


@pytest.mark.parametrize("saved", [[7, 3, 200], torch.tensor([7, 3, 200], dtype=torch.int32)])
def test_a_list_or_a_tensor_of_ids_loads_in_its_order(tmp_path, saved):
    ids = load_token_map(_save(tmp_path / "map.pt", saved), VOCAB)
    assert ids.dtype == torch.int64 and ids.tolist() == [7, 3, 200]


def test_only_a_drafter_that_reads_the_targets_vocabulary_takes_a_map(tmp_path):
    with pytest.raises(ConfigError, match="SpeculativeConfig.token_map=.*not method 'ngram'"):
        SpeculativeConfig("ngram", token_map="map.pt")
    with pytest.raises(ConfigError, match="token_map"):
        SpeculativeConfig(token_map="map.pt")
    zoo_py = str(ZOO / "tinypy")
    for flags, why in [
        (["--method", "eagle3"], "--speculative-token-map map.pt is given, but --method eagle3"),
        (["--method", "ngram"], "--speculative-token-map map.pt is given, but --method ngram"),
        (["--method", "none"], "--speculative-token-map map.pt is given, but --method is none"),
    ]:
        a = parse_args(
            ["generate", zoo_py, "--prompt", "x", "--speculative-token-map", "map.pt", *flags]
        )
        with pytest.raises(ValueError, match=why):
            speculative_config(a)
    given = ["generate", zoo_py, "--prompt", "x", "--method", "mtp", "--speculative-token-map"]
    with pytest.raises(ConfigError, match="--speculative-token-map m.pt: no such file"):
        speculative_config(parse_args([*given, "m.pt"]))  # (before the model loads)
    wide = _save(tmp_path / "wide.pt", [1, 5000])
    with pytest.raises(
        ConfigError, match="token id 5000 is outside the target's vocabulary of 4096"
    ):
        speculative_config(parse_args([*given, str(wide)]))
    fine = _save(tmp_path / "map.pt", [1, 2, 3])
    assert speculative_config(parse_args([*given, str(fine)])).token_map == str(fine)


@pytest.fixture(scope="module")
def targets(tmp_path_factory):
    """MTP layout -> a target with MTP layers, loaded in float32."""
    step_dir, _ = write_checkpoint(tmp_path_factory.mktemp("step3p5"), STEP_CONFIG)
    _, qwen_dir = save_with_mtp("qwen3_next", tmp_path_factory.mktemp("qwen3_next"), num_layers=1)
    root = tmp_path_factory.mktemp("llama")
    paths = {
        "llama (the target's head)": random_llama(root / "llama", VOCAB, seed=0, mtp_layers=2),
        "deepseek-v3 (own heads)": ZOO / "tinyds",
        "qwen3-next (normed output)": qwen_dir,
        "step-3.5 (own zero-centred heads)": step_dir,
    }
    return {name: load_model(path, torch.float32) for name, path in paths.items()}


@pytest.mark.parametrize(
    "layout",
    [
        "llama (the target's head)",
        "deepseek-v3 (own heads)",
        "qwen3-next (normed output)",
        "step-3.5 (own zero-centred heads)",
    ],
)
def test_a_hot_head_gives_the_full_heads_logits_at_the_maps_tokens(targets, layout):
    target = targets[layout]
    vocab, hidden = target.config.vocab_size, target.config.hidden_size
    g = torch.Generator().manual_seed(0)
    ids = torch.randperm(vocab, generator=g)[
        : max(3, vocab // 3)
    ]  # a third of the tokens, shuffled
    for layer in target.mtp_layers:
        h = torch.randn(5, hidden, generator=g)
        norm, head = layer.head_parts(target)
        readout = Readout(norm, head, HotHead(head, ids))
        full = layer.compute_logits(target, h)  # [5, vocab]
        logits = readout.logits(h)
        torch.testing.assert_close(logits[:, ids], full[:, ids], rtol=1e-5, atol=1e-5)
        outside = torch.ones(vocab, dtype=torch.bool)
        outside[ids] = False
        assert torch.isneginf(logits[:, outside]).all()
        assert torch.equal(readout.greedy_tokens(h), ids[full[:, ids].argmax(-1)])
        rows = torch.tensor([4, 1])
        assert torch.equal(readout.greedy_tokens(h, rows), ids[full[rows][:, ids].argmax(-1)])
        assert torch.equal(Readout(norm, head).greedy_tokens(h, rows), full[rows].argmax(-1))


def _run(path: Path, spec: SpeculativeConfig, prompts, params):
    """(outputs, every draft token proposed) of a float32 engine on the CPU, steps run eagerly."""
    llm = LLM(str(path), dtype="float32", cuda_graphs=False, speculative=spec, seed=0)
    proposer, drafted = llm.engine.proposer, []
    draft = proposer.draft

    def recording(rows, shape):
        drafts = draft(rows, shape)
        drafted.append(drafts.token_ids[:, 1:].reshape(-1))
        return drafts

    proposer.draft = recording
    return llm.generate(prompts, params), torch.cat(drafted)


@pytest.mark.parametrize(
    "name, method, steps",
    [("tinypy", "mtp", 2), ("tinyds", "mtp", 2), ("tinypy", "dflash", 7)],
)
def test_drafts_through_a_map_are_its_tokens_and_commit_plain_decodings(
    tmp_path, name, method, steps
):
    """Greedy on the zoo's MTP targets and DFlash draft: through a map of half the vocabulary (every token the runs
    commit among them, so that drafts still land, and none of the wrong drafts made without a map), every draft is
    a map token and the output is the target's own; a map of the whole vocabulary, shuffled, drafts exactly what no
    map drafts."""
    path = ZOO / name
    vocab = load_model(path, torch.float32).config.vocab_size
    prompts = [[5 + 7 * i + j for j in range(6 + i)] for i in range(3)]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    draft = str(ZOO / f"{name}-dflash") if method == "dflash" else None
    mtp = dict(method=method, draft=draft, num_steps=steps, adaptive=False)
    plain = LLM(str(path), dtype="float32", cuda_graphs=False).generate(prompts, params)
    free, free_drafts = _run(path, SpeculativeConfig(**mtp), prompts, params)
    g = torch.Generator().manual_seed(1)
    shuffled = _save(tmp_path / "all.pt", torch.randperm(vocab, generator=g))
    same, same_drafts = _run(
        path, SpeculativeConfig(**mtp, token_map=str(shuffled)), prompts, params
    )
    assert torch.equal(same_drafts, free_drafts)
    committed = {t for o in plain for t in o.token_ids}
    missed = set(free_drafts.tolist()) - committed  # drafts the map leaves out
    assert missed, "every draft was right: a map of the committed tokens would narrow nothing"
    others = [t for t in torch.randperm(vocab, generator=g).tolist() if t not in committed | missed]
    half = sorted(committed) + others[: vocab // 2 - len(committed)]
    hot = _save(tmp_path / "half.pt", half)
    mapped, mapped_drafts = _run(
        path, SpeculativeConfig(**mtp, token_map=str(hot)), prompts, params
    )
    assert set(mapped_drafts.tolist()) <= set(half)
    for outs in (free, same, mapped):
        assert [o.token_ids for o in outs] == [o.token_ids for o in plain]
    assert sum(o.spec_metrics.num_accepted_drafts for o in mapped) > 0


def _token_map(text: Path, size: int, out: Path) -> None:
    from outpace.cli import main

    main(
        [
            "token-map",
            str(ZOO / "tinypy"),
            "--text",
            str(text),
            "--size",
            str(size),
            "--out",
            str(out),
        ]
    )


def test_token_map_writes_the_most_frequent_tokens_of_a_text(tmp_path, capsys):
    from outpace.engine.start_up import load_tokenizer

    tokenizer = load_tokenizer(ZOO / "tinypy")

    def ranked(
        texts: list[str],
    ) -> list[int]:  # each text tokenized alone; most frequent first, ties by id
        counts = Counter(
            t for x in texts for t in tokenizer(x, add_special_tokens=False)["input_ids"]
        )
        return sorted(counts, key=lambda t: (-counts[t], t))

    pieces = ["def f(x):\n    return x + 1\n", "for i in range(10):\n    print(i, i)\n"]
    lines, out = tmp_path / "code.jsonl", tmp_path / "map.pt"
    lines.write_text("".join(json.dumps({"text": p}) + "\n" for p in pieces))
    _token_map(lines, 6, out)
    ids = torch.load(out, weights_only=True)
    assert ids == ranked(pieces)[:6]
    assert load_token_map(out, 4096).tolist() == ids
    assert "6 of 4096 tokens" in capsys.readouterr().out
    # a plain file is counted whole: its newline-and-indent tokens span its line breaks
    plain = tmp_path / "code.py"
    plain.write_text("".join(pieces))
    _token_map(plain, 6, out)
    assert torch.load(out, weights_only=True) == ranked(["".join(pieces)])[:6]
    lines.write_text('{"text": "x"}\n{"prompt": "y"}\n')
    with pytest.raises(SystemExit, match=f"--text {lines}: line 2 has no 'text' string"):
        _token_map(lines, 6, out)
    with pytest.raises(SystemExit, match="--size 5000 is not in"):
        _token_map(lines, 5000, out)


@pytest.mark.gpu
@pytest.mark.parametrize("method, steps", [("mtp", 3), ("dflash", 7)])
def test_drafts_through_a_map_in_captured_steps_commit_plain_decodings(tmp_path, method, steps):
    """On the GPU, the steps captured as CUDA graphs (the head's argmax in one launch, the map's rows whole): the
    zoo's target through a map of its 1,024 lowest ids with every token plain decoding commits, float32, gives
    plain decoding's tokens and accepts drafts."""
    path, prompts = ZOO / "tinypy", [[5 + 7 * i + j for j in range(6 + i)] for i in range(4)]
    params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    engine = dict(device="cuda", dtype="float32", seed=0)
    plain = [o.token_ids for o in LLM(str(path), **engine).generate(prompts, params)]
    ids = sorted(set(range(1024)) | {t for tokens in plain for t in tokens})
    draft = str(ZOO / "tinypy-dflash") if method == "dflash" else None
    spec = SpeculativeConfig(
        method, draft, num_steps=steps, adaptive=False, token_map=str(_save(tmp_path / "m.pt", ids))
    )
    outs = LLM(str(path), speculative=spec, **engine).generate(prompts, params)
    assert [o.token_ids for o in outs] == plain
    assert sum(o.spec_metrics.num_accepted_drafts for o in outs) > 0
