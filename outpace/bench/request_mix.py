"""A seeded request mix for serving benches: a few shared "system prompts", then user parts and
max_tokens of varied lengths.

The text is the zoo's held-out prompts (zoo/eval_prompts.json: code the zoo models never trained on,
so the drafts accept as they would on new input). Prefix i is the prompts joined by blank lines,
starting at its own prompt (so the prefixes differ from their first block), cut at the last line
break within ``prefix_chars[i]`` characters; the default 150 to 600 characters give 41, 96, 126 and
191 tokens of the zoo tokenizer, the longest 12 KV blocks of 16. The prefixes do not depend on the
seed: every load level and every server of a sweep shares them, and a prefix cache can serve them. A
request is a random prefix, then a random prompt cut to between a quarter of it and all of it (10 to
120 tokens), and asks for a number of tokens drawn uniformly from ``max_tokens`` (both ends included).

NOTE: the zoo target trained on 512-token windows and its EAGLE3 draft on 256-token ones, and
acceptance falls on longer contexts. With the zoo target and draft (CPU, float32, 8 requests of 128
tokens, fixed 5-step chains) tau was 3.8 without a prefix, 4.2 with a 44-token prefix, 3.3 with 175
tokens, 2.4 with 241 and 1.1 with 8 joined prompts (680 tokens): hence prefixes of at most ~200 tokens.
"""

from __future__ import annotations

import random

from outpace.server.bench import BenchRequest

PREFIX_CHARS = (150, 300, 450, 600)


def shared_prefixes(prompts: list[str], prefix_chars: tuple[int, ...] = PREFIX_CHARS) -> list[str]:
    """Prefix i: the prompts from prompt ``i * len(prompts) // n`` on (cycling), each followed by a blank
    line, up to the last line break within ``prefix_chars[i]`` characters."""
    prefixes = []
    for i, n in enumerate(prefix_chars):
        start, text = i * len(prompts) // len(prefix_chars), ""
        while len(text) < n:
            text += prompts[start % len(prompts)] + "\n\n"
            start += 1
        prefixes.append(text[: text.rfind("\n", 0, n) + 1] or text[:n])
    return prefixes


def request_mix(
    prompts: list[str],
    num_requests: int,
    seed: int | str,
    max_tokens: tuple[int, int] = (32, 128),
    prefix_chars: tuple[int, ...] = PREFIX_CHARS,
) -> list[BenchRequest]:
    rng = random.Random(seed)
    prefixes = shared_prefixes(prompts, prefix_chars)
    requests = []
    for _ in range(num_requests):
        prefix, user = rng.choice(prefixes), rng.choice(prompts)
        user = user[: rng.randint(len(user) // 4, len(user))]
        requests.append(BenchRequest(prefix + user, rng.randint(*max_tokens)))
    return requests
