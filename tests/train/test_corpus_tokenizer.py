"""Corpus building/splitting and the byte-level BPE tokenizer (CPU, a few seconds)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from outpace.train.corpus import Corpus, SourceFile, build_corpus, heldout_prompts, is_heldout
from outpace.train.tokenizer import (
    ASSISTANT_TOKEN,
    EOS_TOKEN,
    MASK_TOKEN,
    PAD_TOKEN,
    SYSTEM_TOKEN,
    USER_TOKEN,
    save_tokenizer,
    special_token_ids,
    train_tokenizer,
)

NUM_MODULES = 40
HELDOUT_FRACTION = 0.3


def module_text(i: int) -> str:
    """Unique, > 200 bytes, with top-level def/class lines to cut prompts at."""
    parts = [f'"""Module {i}."""\n\nimport os\n\n']
    for j in range(8):
        parts.append(f"def func_{i}_{j}(x, y={j}):\n    z = x * {j} + y\n    return z - {i}\n\n\n")
    parts.append(f"class Thing{i}:\n    def method(self):\n        return {i}\n")
    return "".join(parts)


@pytest.fixture(scope="module")
def source_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("src")
    (root / "pkg").mkdir()
    for i in range(NUM_MODULES):
        (root / "pkg" / f"mod_{i}.py").write_text(module_text(i))
    # Duplicates of pkg/mod_3.py: "dup/copy_a.py" sorts first, so it is the one kept.
    (root / "dup").mkdir()
    (root / "dup" / "copy_a.py").write_text(module_text(3))
    (root / "dup" / "copy_b.py").write_text(module_text(3))
    (root / "bad_encoding.py").write_bytes(b"# \xff\xfe not utf-8\n" + b"x = 1\n" * 60)
    (root / "tiny.py").write_text("x = 1\n")
    (root / "notes.txt").write_text("not python\n" * 50)
    (root / "pkg" / "__pycache__").mkdir()
    (root / "pkg" / "__pycache__" / "cached.py").write_text(module_text(1000))
    (root / "outpace").mkdir()  # an installed copy of ourselves: never trained on
    (root / "outpace" / "engine.py").write_text(module_text(2000))
    return root


@pytest.fixture(scope="module")
def corpus(source_root) -> Corpus:
    return build_corpus([source_root], heldout_fraction=HELDOUT_FRACTION)


def test_is_heldout_is_pinned_across_machines():
    # Computed once from sha256; a change here would reshuffle every saved split.
    assert hashlib.sha256(b"json/decoder.py").hexdigest()[:16] == "3b2e3cb3d29d57a5"
    assert is_heldout("json/decoder.py", 0.5) is True
    assert is_heldout("os.py", 0.5) is False
    assert is_heldout("mod_10.py", 0.05) is True
    assert is_heldout("mod_11.py", 0.05) is False
    assert not is_heldout("json/decoder.py", 0.0)
    assert is_heldout("os.py", 1.0)
    with pytest.raises(ValueError):
        is_heldout("os.py", 1.5)


def test_corpus_files_dedup_and_skips(corpus):
    files = corpus.train + corpus.heldout
    paths = [f.rel_path for f in files]
    assert len(paths) == len(set(paths))
    expected = {f"pkg/mod_{i}.py" for i in range(NUM_MODULES) if i != 3} | {"dup/copy_a.py"}
    assert set(paths) == expected
    texts = [f.text for f in files]
    assert len(texts) == len(set(texts))
    by_path = {f.rel_path: f.text for f in files}
    assert by_path["pkg/mod_7.py"] == module_text(7)


def test_split_is_deterministic_and_disjoint(source_root, corpus):
    train_paths = {f.rel_path for f in corpus.train}
    heldout_paths = {f.rel_path for f in corpus.heldout}
    assert train_paths and heldout_paths
    assert not train_paths & heldout_paths
    assert all(is_heldout(p, HELDOUT_FRACTION) for p in heldout_paths)
    assert not any(is_heldout(p, HELDOUT_FRACTION) for p in train_paths)
    assert [f.rel_path for f in corpus.train] == sorted(train_paths)
    assert [f.rel_path for f in corpus.heldout] == sorted(heldout_paths)
    again = build_corpus([source_root], heldout_fraction=HELDOUT_FRACTION)
    assert again == corpus
    stats = corpus.stats()
    assert stats["train_files"] == len(train_paths)
    assert stats["heldout_bytes"] == sum(len(f.text.encode()) for f in corpus.heldout)


def test_nested_roots_and_total_cap(source_root, corpus):
    # pkg/ is also a root (like site-packages inside the stdlib directory): the outer
    # root does not descend into it, so its files keep rel_paths relative to pkg/.
    nested = build_corpus([source_root, source_root / "pkg"], heldout_fraction=HELDOUT_FRACTION)
    paths = [f.rel_path for f in nested.train + nested.heldout]
    expected = {f"mod_{i}.py" for i in range(NUM_MODULES) if i != 3} | {"dup/copy_a.py"}
    assert sorted(paths) == sorted(expected)
    capped = build_corpus([source_root], heldout_fraction=HELDOUT_FRACTION, max_total_bytes=1000)
    assert 1 <= len(capped.train) < len(corpus.train)
    assert capped.train == corpus.train[: len(capped.train)]  # one root: walk order == sorted
    assert (
        sum(len(f.text) for f in capped.train[:-1]) < 1000 <= sum(len(f.text) for f in capped.train)
    )
    assert capped.heldout == corpus.heldout


def test_heldout_prompts(corpus):
    prompts = heldout_prompts(corpus, num_prompts=12, prompt_chars=200, seed=0)
    assert prompts == heldout_prompts(corpus, num_prompts=12, prompt_chars=200, seed=0)
    assert prompts != heldout_prompts(corpus, num_prompts=12, prompt_chars=200, seed=1)
    assert len(prompts) == 12
    for prompt in prompts:
        assert 0 < len(prompt) <= 200 and not prompt.endswith("\n")
        assert prompt.startswith(("def ", "class "))
        hosts = [f for f in corpus.heldout if prompt in f.text]
        assert hosts, "prompt must come from a held-out file"
        start = hosts[0].text.index(prompt)
        assert start == 0 or hosts[0].text[start - 1] == "\n"
        assert not any(prompt in f.text for f in corpus.train)
    with pytest.raises(ValueError):
        heldout_prompts(Corpus(train=[SourceFile("a.py", "x")], heldout=[]), 1)


ROUND_TRIP = (
    "def f(x) :\n\tif x . y  ,  z:\r\n        return 'héllo → 世界 🐍'  # \u2028 done\n"
    "class A(B):\n    pass\n\n\n" + EOS_TOKEN + "\n"
)


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory, corpus) -> Path:
    import json.decoder
    import textwrap

    stdlib = [Path(m.__file__).read_text(encoding="utf-8") for m in (json.decoder, textwrap)]
    texts = [f.text for f in corpus.train] + stdlib
    tok = train_tokenizer(texts, vocab_size=400)
    assert tok.get_vocab_size() == 400
    # Deterministic: a second training gives the identical serialized tokenizer.
    assert train_tokenizer(texts, vocab_size=400).to_str() == tok.to_str()
    out = tmp_path_factory.mktemp("tok")
    save_tokenizer(tok, out, model_max_length=512)
    return out


def test_tokenizer_files_and_special_ids(tokenizer_dir):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    assert special_token_ids(tok) == {
        EOS_TOKEN: 0,
        PAD_TOKEN: 1,
        MASK_TOKEN: 2,
        SYSTEM_TOKEN: 3,
        USER_TOKEN: 4,
        ASSISTANT_TOKEN: 5,
    }
    config = json.loads((tokenizer_dir / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert (tokenizer_dir / "special_tokens_map.json").exists()


def test_autotokenizer_loads_and_round_trips(tokenizer_dir):
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(tokenizer_dir)
    assert hf.is_fast
    assert (hf.eos_token, hf.eos_token_id) == (EOS_TOKEN, 0)
    assert (hf.pad_token, hf.pad_token_id) == (PAD_TOKEN, 1)
    assert (hf.mask_token, hf.mask_token_id) == (MASK_TOKEN, 2)
    assert hf.bos_token is None
    assert hf.model_max_length == 512
    ids = hf(ROUND_TRIP)["input_ids"]
    assert ids[0] != 0 and ids[-2:] == [0, hf.convert_tokens_to_ids("Ċ")]  # no bos; eos special
    assert hf.decode(ids) == ROUND_TRIP
    assert hf.decode(ids, skip_special_tokens=True) == ROUND_TRIP.replace(EOS_TOKEN, "")


def test_chat_template(tokenizer_dir):
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(tokenizer_dir)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    text = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == "<|system|>\nBe brief.<|endoftext|>\n<|user|>\nhi<|endoftext|>\n<|assistant|>\n"
    ids = hf.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    assert ids[0] == 3 and ids.count(0) == 2 and 4 in ids and ids[-2] == 5
    no_prompt = hf.apply_chat_template(messages, tokenize=False)
    assert not no_prompt.endswith("<|assistant|>\n")
