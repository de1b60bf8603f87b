"""Prompts for draft training from the user's own files (``outpace train draft --data FILE ...``).

The target regenerates the responses (train/distill.py), as SpecForge's ``regenerate_train_data.py`` and
vLLM's speculators regenerate them, so only the prompts are read here:
- ``.jsonl``: one prompt per line: a JSON string, or an object with ``prompt``, ``text``, ``input`` or
  ``question``, or with ``messages`` / ``conversations`` (``role``/``content`` or ShareGPT ``from``/``value``
  turns) rendered with the target tokenizer's chat template up to the last user turn (generation prompt
  added). Each prompt keeps its last ``prompt_len`` tokens.
- any other file: plain text, one document; the prompts are windows of ``prompt_len`` tokens cut at random
  offsets of all documents back to back (as the zoo corpus is cut).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

_TEXT_KEYS = ("prompt", "text", "input", "question")
_SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "system": "system",
}


def _conversation(turns: list[dict]) -> list[dict]:
    """Turns in either form -> [{"role", "content"}] up to and including the last user turn."""
    messages = [
        {
            "role": _SHAREGPT_ROLES.get(t.get("role", t.get("from")), t.get("role", t.get("from"))),
            "content": t.get("content", t.get("value", "")),
        }
        for t in turns
    ]
    last_user = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=None)
    if last_user is None:
        raise ValueError("a conversation has no user turn")
    return messages[: last_user + 1]


def record_ids(record, tokenizer, where: str) -> list[int]:
    """One jsonl record -> its prompt token ids (no truncation)."""
    if isinstance(record, str):
        return tokenizer.encode(record, add_special_tokens=False)
    if not isinstance(record, dict):
        raise ValueError(
            f"{where}: a record must be a string or an object, not {type(record).__name__}"
        )
    for key in _TEXT_KEYS:
        if isinstance(record.get(key), str):
            return tokenizer.encode(record[key], add_special_tokens=False)
    turns = record.get("messages", record.get("conversations"))
    if isinstance(turns, list):
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                f"{where}: a conversation needs a chat template, and the target's tokenizer has none"
            )
        text = tokenizer.apply_chat_template(
            _conversation(turns), tokenize=False, add_generation_prompt=True
        )
        return tokenizer.encode(text, add_special_tokens=False)
    raise ValueError(
        f"{where}: no prompt found (keys {sorted(record)}; expected one of "
        f"{list(_TEXT_KEYS) + ['messages', 'conversations']})"
    )


def load_prompt_ids(
    files, target_dir: Path, prompt_len: int, num: int, seed: int = 0
) -> list[list[int]]:
    """At most ``num`` prompts (token ids, each 1..prompt_len long) from ``files``: every jsonl prompt (its
    last ``prompt_len`` tokens) in file order, then random windows of the text files for the rest."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(target_dir))
    prompts: list[list[int]] = []
    stream: list[int] = []
    for f in map(Path, files):
        if not f.is_file():
            raise FileNotFoundError(f"--data {f}: no such file")
        if f.suffix == ".jsonl":
            for i, line in enumerate(f.read_text().splitlines()):
                if line.strip():
                    ids = record_ids(json.loads(line), tokenizer, f"{f}:{i + 1}")
                    if ids:
                        prompts.append(ids[-prompt_len:])
        else:
            stream += tokenizer.encode(f.read_text(), add_special_tokens=False)
            if tokenizer.eos_token_id is not None:
                stream.append(tokenizer.eos_token_id)
    prompts = prompts[:num]
    missing = num - len(prompts)
    if missing and len(stream) > prompt_len:
        g = torch.Generator().manual_seed(seed)
        starts = torch.randint(0, len(stream) - prompt_len, (missing,), generator=g).tolist()
        prompts += [stream[s : s + prompt_len] for s in starts]
    if not prompts:
        raise ValueError(
            f"--data {[str(f) for f in files]}: no prompts (jsonl records or text longer than "
            f"{prompt_len} tokens)"
        )
    return prompts
