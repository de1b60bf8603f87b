"""``outpace token-map``: a token map for ``--speculative-token-map`` (speculative/hot_vocab.py) from text: the
model's tokenizer's most frequent tokens in it (FR-Spec's frequency ranking), saved as ``torch.save`` of a list of
ids, the file SGLang reads too."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction) -> None:
    t = sub.add_parser(
        "token-map",
        help="the most frequent tokens of some text, for --speculative-token-map",
    )
    t.add_argument("model", help="the model directory whose tokenizer counts the tokens")
    t.add_argument(
        "--text",
        nargs="+",
        required=True,
        metavar="FILE",
        help="text to count: plain text, or JSON lines each with a 'text' field (.jsonl)",
    )
    t.add_argument("--size", type=int, required=True, help="tokens in the map")
    t.add_argument("--out", required=True, help="the map's file (torch.save of a list of ids)")
    t.set_defaults(func=run)


def texts(path: Path) -> Iterator[str]:
    """The pieces of text a file holds, each tokenized whole: each JSON line's 'text' (.jsonl), else the file
    (cut at its lines, tokens that span a line break, as code tokenizers' newline-and-indent ones do, would go
    uncounted)."""
    if path.suffix != ".jsonl":
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"--text {path}: not UTF-8 text ({e})") from None
        yield text
        return
    with path.open("rb") as f:  # (bytes, decoded a line at a time: an error names its line)
        for n, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise ValueError(f"--text {path}: line {n} is not UTF-8 text ({e})") from None
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"--text {path}: line {n} is not JSON ({e})") from e
            if not isinstance(record, dict) or not isinstance(record.get("text"), str):
                raise ValueError(f"--text {path}: line {n} has no 'text' string")
            yield record["text"]


def run(a: argparse.Namespace) -> None:
    # NOTE: imported here, not at the top: the parser (and `outpace --help`) loads no torch
    import torch

    from outpace.engine.start_up import load_tokenizer
    from outpace.model_config import ModelConfig
    from outpace.speculative.hot_vocab import most_frequent, token_counts

    out = Path(a.out)
    if out.is_dir():
        sys.exit(f"error: --out {out} is a directory: name the map's file")
    if not out.parent.is_dir():
        sys.exit(f"error: --out {out}: no directory {out.parent} to write it in")
    vocab = ModelConfig.from_pretrained(a.model).vocab_size
    if not 0 < a.size <= vocab:
        sys.exit(f"error: --size {a.size} is not in [1, {vocab}] (the model's vocabulary)")
    tokenizer = load_tokenizer(a.model)
    if tokenizer is None:
        sys.exit(f"error: {a.model} has no tokenizer to count tokens with")
    paths = [Path(name) for name in a.text]
    for path in paths:
        if not path.is_file():
            sys.exit(f"error: --text {path}: no such file")
    counts = token_counts(tokenizer, (piece for path in paths for piece in texts(path)), vocab)
    ids = most_frequent(counts, a.size)
    torch.save(ids.tolist(), a.out)
    seen = int((counts > 0).sum())
    print(
        f"{a.out}: {a.size} of {vocab} tokens, covering {float(counts[ids].sum()) / max(1, int(counts.sum())):.1%} "
        f"of the {int(counts.sum())} tokens counted ({seen} distinct)"
    )
