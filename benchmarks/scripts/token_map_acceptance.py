"""What a token map (``--speculative-token-map``, speculative/hot_vocab.py) costs MTP drafts in acceptance, and what
it saves in head bytes: the zoo's MTP targets, greedy, on the zoo's held-out prompts, with no map and with maps of
the most frequent tokens of a text (``outpace token-map``'s ranking), each run's acceptance length (tau) and
acceptance rate per draft position, and the share of the head a draft step reads. Float32 on the CPU. The text: the
zoo's training corpus (train/corpus.py: this machine's Python files, the held-out ones never among them), its first
``--corpus-bytes``, as FR-Spec ranks a general corpus's tokens; or ``--text FILE``.

    python benchmarks/scripts/token_map_acceptance.py [--text FILE | --corpus-bytes 8000000]
        [--targets tinypy tinyds tinyqwen35] [--sizes 2048 1024 512 256] [--num-steps 3] [--max-tokens 96]
        [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch

from outpace import LLM, SamplingParams
from outpace.config import SpeculativeConfig
from outpace.engine.start_up import load_tokenizer
from outpace.speculative.hot_vocab import most_frequent, token_counts
from outpace.speculative.metrics import SpecMetrics
from outpace.zoo import zoo_dir


def training_documents(most_bytes: int) -> list[str]:
    """The zoo's training split (train/corpus.py ``build_corpus``), up to ``most_bytes``: its files' texts."""
    from outpace.train.corpus import build_corpus

    return [f.text for f in build_corpus(max_total_bytes=most_bytes).train]


def run(target: Path, token_map: Path | None, prompts: list[str], a) -> dict:
    spec = SpeculativeConfig(
        "mtp",
        num_steps=a.num_steps,
        adaptive=False,
        token_map=None if token_map is None else str(token_map),
    )
    llm = LLM(str(target), device="cpu", dtype="float32", speculative=spec, seed=0)
    params = SamplingParams(temperature=0.0, max_tokens=a.max_tokens, ignore_eos=True)
    outs = llm.generate(prompts, params)
    total = SpecMetrics.total(o.spec_metrics for o in outs)
    return {
        "tau": round(total.acceptance_length, 4),
        "rate_per_position": [round(r, 4) for r in total.acceptance_rate_per_position],
        "tokens": [o.token_ids for o in outs],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--text", default=None, help="the text whose most frequent tokens make the maps")
    p.add_argument("--corpus-bytes", type=int, default=8_000_000)
    p.add_argument("--targets", nargs="+", default=["tinypy", "tinyds", "tinyqwen35"])
    p.add_argument("--sizes", type=int, nargs="+", default=[2048, 1024, 512, 256])
    p.add_argument("--num-steps", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    prompts = json.loads((zoo_dir() / "eval_prompts.json").read_text())["prompts"]
    rows, work = [], Path(tempfile.mkdtemp(prefix="token_map_"))
    documents = (
        [Path(a.text).read_text(encoding="utf-8")] if a.text else training_documents(a.corpus_bytes)
    )
    print(f"{'target':<12}{'map':>6}{'head read':>11}{'tau':>8}  rate per position        output")
    for name in a.targets:
        target = zoo_dir() / name
        tokenizer = load_tokenizer(target)
        vocab = json.loads((target / "config.json").read_text())["vocab_size"]
        counts = token_counts(tokenizer, documents, vocab)
        plain = None
        for size in [None, *a.sizes]:
            path = None
            if size is not None:
                path = work / f"{name}_{size}.pt"
                torch.save(most_frequent(counts, size).tolist(), path)
            row = run(target, path, prompts, a)
            plain = plain or row["tokens"]
            same = row.pop("tokens") == plain  # greedy: the output never depends on the map
            share = 1.0 if size is None else size / vocab
            rows.append(
                {"target": name, "map": size, "head_share": share, **row, "same_output": same}
            )
            rates = " ".join(f"{r:.3f}" for r in row["rate_per_position"])
            print(
                f"{name:<12}{size or '-':>6}{share:>10.1%}{row['tau']:>8.3f}  {rates:<24} "
                f"{'equal' if same else 'DIFFERS'}"
            )
    if a.out:
        Path(a.out).write_text(json.dumps({"args": vars(a), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
