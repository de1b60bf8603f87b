"""Byte-level BPE tokenizer for the toy targets and drafts, trained with `tokenizers`.

Special tokens come first in the vocabulary, so their ids are fixed:

    0 <|endoftext|>   EOS; also ends every chat message
    1 <|pad|>         padding
    2 <|mask|>        placeholder positions of DFlash block drafts
    3 <|system|>      chat role markers
    4 <|user|>
    5 <|assistant|>

Ids 6..261 are the 256 byte symbols, then the learned merges. There is no BOS token.
Being byte-level, decode(encode(text)) == text for any string.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"
MASK_TOKEN = "<|mask|>"
SYSTEM_TOKEN = "<|system|>"
USER_TOKEN = "<|user|>"
ASSISTANT_TOKEN = "<|assistant|>"

# NOTE: order defines the ids documented above; do not reorder.
SPECIAL_TOKENS = (EOS_TOKEN, PAD_TOKEN, MASK_TOKEN, SYSTEM_TOKEN, USER_TOKEN, ASSISTANT_TOKEN)
CHAT_TOKENS = (SYSTEM_TOKEN, USER_TOKEN, ASSISTANT_TOKEN)

# Each message renders as "<|role|>\n{content}<|endoftext|>\n"; the generation prompt is
# "<|assistant|>\n", so a reply ends when the model emits EOS.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('unknown chat role: ' + message['role']) }}"
    "{% endif %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + '<|endoftext|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)

_NUM_BYTES = 256


def train_tokenizer(
    texts: Iterable[str],
    vocab_size: int = 6144,
    min_frequency: int = 2,
    show_progress: bool = False,
) -> Tokenizer:
    """Train a byte-level BPE tokenizer on texts.

    Deterministic: the same texts in the same order give the same vocabulary and merges
    (the BPE trainer breaks count ties by pair id, and the byte alphabet is fixed).
    """
    min_vocab = len(SPECIAL_TOKENS) + _NUM_BYTES
    if vocab_size < min_vocab:
        raise ValueError(
            f"vocab_size must be at least {min_vocab} (specials + bytes), got {vocab_size}"
        )
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=show_progress,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    ids = special_token_ids(tok)
    expected = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
    if ids != expected:  # guards the documented ids against library behaviour changes
        raise RuntimeError(f"special token ids {ids} differ from the documented {expected}")
    return tok


def special_token_ids(tok: Tokenizer) -> dict[str, int]:
    """Map each special token string to its id in tok."""
    ids = {}
    for token in SPECIAL_TOKENS:
        token_id = tok.token_to_id(token)
        if token_id is None:
            raise KeyError(f"tokenizer has no special token {token!r}")
        ids[token] = token_id
    return ids


def save_tokenizer(tok: Tokenizer, out_dir: Path | str, model_max_length: int) -> None:
    """Write tok so `transformers.AutoTokenizer.from_pretrained(out_dir)` loads it.

    Writes tokenizer.json, tokenizer_config.json (PreTrainedTokenizerFast with eos, pad,
    mask, chat tokens and CHAT_TEMPLATE; no bos) and special_tokens_map.json.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    special_token_ids(tok)  # fail early when a special token is missing
    tok.save(str(out_dir / "tokenizer.json"))
    special_map = {
        "eos_token": EOS_TOKEN,
        "pad_token": PAD_TOKEN,
        "mask_token": MASK_TOKEN,
        "additional_special_tokens": list(CHAT_TOKENS),
    }
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": model_max_length,
        "bos_token": None,
        "unk_token": None,
        **special_map,
        "add_bos_token": False,
        "add_eos_token": False,
        # NOTE: must stay False, or decode() rewrites " ." etc. and breaks the round trip.
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }
    _write_json(out_dir / "tokenizer_config.json", config)
    _write_json(out_dir / "special_tokens_map.json", special_map)


def _write_json(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
