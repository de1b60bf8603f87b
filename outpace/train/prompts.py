"""Prompts for draft training from the user's own files (``outpace train draft --data FILE ...``).

The target regenerates the responses (train/distill.py), as SpecForge's ``regenerate_train_data.py`` and
vLLM's speculators regenerate them, so only the prompts are read here:
- ``.jsonl``: one prompt per line: a JSON string, or an object with ``prompt``, ``text``, ``input`` or
  ``question``, or with ``messages`` / ``conversations`` (``role``/``content`` or ShareGPT ``from``/``value``
  turns) rendered with the target tokenizer's chat template up to the last user turn (generation prompt
  added). Each prompt keeps its last ``prompt_len`` tokens.
- ``.json``: a JSON list of such records (ShareGPT's files are one).
- any other file: plain text, one document; the prompts are windows of ``prompt_len`` tokens cut at random
  offsets of all documents back to back (as the zoo corpus is cut).

A record that cannot be read is refused naming its file and line (``.json``: its index in the list): a line
that is not JSON, a file that is not UTF-8, a turn that is not an object, a role outside ``_SHAREGPT_ROLES``,
content that is not a string, a conversation without a user turn or whose last user turn is empty, an empty
prompt.
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
    "tool": "tool",
}


def _conversation(turns: list, where: str) -> list[dict]:
    """Turns in either form -> [{"role", "content"}] up to and including the last user turn; a turn that is
    not an object, has no known role, or whose content is not a string is refused (``where``: file:line)."""
    messages = []
    for i, t in enumerate(turns):
        if not isinstance(t, dict):
            raise ValueError(
                f"{where}: turn {i} must be an object with role/content (or from/value), "
                f"not {type(t).__name__}"
            )
        role = t.get("role", t.get("from"))
        if role not in _SHAREGPT_ROLES:
            raise ValueError(
                f"{where}: turn {i} has role {role!r}: must be one of {sorted(_SHAREGPT_ROLES)} "
                "(field 'role', or ShareGPT's 'from')"
            )
        content = t.get("content", t.get("value", ""))
        if not isinstance(content, str):
            raise ValueError(
                f"{where}: turn {i}'s content must be a string, not {type(content).__name__}"
            )
        messages.append({"role": _SHAREGPT_ROLES[role], "content": content})
    last_user = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=None)
    if last_user is None:
        raise ValueError(f"{where}: the conversation has no user turn")
    if not messages[last_user]["content"].strip():
        raise ValueError(f"{where}: the conversation's last user turn (turn {last_user}) is empty")
    return messages[: last_user + 1]


def record_ids(record, tokenizer, where: str) -> list[int]:
    """One jsonl record -> its prompt token ids (no truncation); an empty prompt is refused."""
    ids = _record_ids(record, tokenizer, where)
    if not ids:
        raise ValueError(f"{where}: the prompt is empty")
    return ids


def _record_ids(record, tokenizer, where: str) -> list[int]:
    if isinstance(record, str):
        return tokenizer.encode(record, add_special_tokens=False)
    if not isinstance(record, dict):
        raise ValueError(
            f"{where}: a record must be a string or an object, not {type(record).__name__}"
        )
    for key in _TEXT_KEYS:
        if record.get(key) is not None:
            if not isinstance(record[key], str):
                raise ValueError(
                    f"{where}: field {key!r} must be a string, not {type(record[key]).__name__}"
                )
            return tokenizer.encode(record[key], add_special_tokens=False)
    for key in ("messages", "conversations"):
        if key not in record:
            continue
        turns = record[key]
        if not isinstance(turns, list):
            raise ValueError(
                f"{where}: field {key!r} must be a list of turns, not {type(turns).__name__}"
            )
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                f"{where}: a conversation needs a chat template, and the target's tokenizer has none"
            )
        try:
            text = tokenizer.apply_chat_template(
                _conversation(turns, where), tokenize=False, add_generation_prompt=True
            )
        except ValueError:
            raise
        except Exception as e:  # the template's own refusals (jinja's raise_exception) and errors
            raise ValueError(
                f"{where}: the target's chat template cannot render this conversation: {e}"
            ) from None
        return tokenizer.encode(text, add_special_tokens=False)
    raise ValueError(
        f"{where}: no prompt found (keys {sorted(record)}; expected one of "
        f"{list(_TEXT_KEYS) + ['messages', 'conversations']})"
    )


def _records(f: Path):
    """(where, record) for each record of a .jsonl or .json file; a file or line that is not JSON is refused
    naming it."""
    text = _read_text(f)
    if f.suffix == ".json":
        try:
            records = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"--data {f}: not JSON ({e})") from None
        if not isinstance(records, list):
            raise ValueError(
                f"--data {f}: a .json prompt file must hold a list of records, "
                f"not {type(records).__name__}"
            )
        yield from ((f"{f}[{i}]", r) for i, r in enumerate(records))
        return
    for i, line in enumerate(text.splitlines()):
        if line.strip():
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{f}:{i + 1}: not a JSON record ({e})") from None
            yield f"{f}:{i + 1}", record


def _read_text(f: Path) -> str:
    try:
        return f.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"--data {f}: not UTF-8 text ({e})") from None


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
        if not f.exists():
            raise FileNotFoundError(f"--data {f}: no such file")
        if not f.is_file():
            raise ValueError(f"--data {f}: not a file")
        if f.suffix in (".jsonl", ".json"):
            for where, record in _records(f):
                prompts.append(record_ids(record, tokenizer, where)[-prompt_len:])
        else:
            stream += tokenizer.encode(_read_text(f), add_special_tokens=False)
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
