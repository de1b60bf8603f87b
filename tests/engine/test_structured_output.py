"""Structured output with speculation: every drafter, greedy and sampled, produces output its grammar
accepts; drafts are masked by the target's grammar-constrained distribution (a draft leaving the
grammar is rejected at that position), the grammar state rolls back with rejected drafts, and nothing
is committed past the grammar's end."""

import json
import os
import re

import pytest
import torch

pytest.importorskip("xgrammar")

from helpers.zoo_drafters import TEST_DEVICE as DEVICE  # noqa: E402
from helpers.zoo_drafters import zoo_drafters
from outpace import LLM, SamplingParams  # noqa: E402
from outpace.config import SpeculativeConfig  # noqa: E402
from outpace.layers.logits_processing import apply_token_bitmask  # noqa: E402
from outpace.sampling_params import StructuredOutputsParams  # noqa: E402
from outpace.speculative.verify import verify_greedy_chain  # noqa: E402
from outpace.structured import GrammarCompiler  # noqa: E402
from outpace.validation import ConfigError  # noqa: E402

ZOO = "zoo/"
DRAFTERS = {"none": SpeculativeConfig(), **zoo_drafters(chain_steps=4, tree=(3, 2, 6))}
SCHEMAS = [
    {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 8},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
        },
        "required": ["name", "age"],
    },
    {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}, "tag": {"enum": ["def", "class", "import"]}},
        "required": ["ok", "tag"],
    },
    {
        "type": "object",
        "properties": {
            "ids": {
                "type": "array",
                "items": {"type": "integer", "minimum": 0, "maximum": 99},
                "minItems": 1,
                "maxItems": 3,
            }
        },
        "required": ["ids"],
    },
]
# A prompt per schema shows an example, as a user would (the n-gram drafter proposes from it).
PROMPTS = [
    'people = [{"name": "ann", "age": 31}]\nperson = ',
    'flags = {"ok": true, "tag": "def"}\nflags = ',
    'batch = {"ids": [4, 17]}\nbatch = ',
]
# 30 requests per drafter: 210 in all; OUTPACE_STRUCTURED_REQUESTS=200 runs 200 per drafter.
PER_DRAFTER = int(os.environ.get("OUTPACE_STRUCTURED_REQUESTS", "30"))


def validate(value, schema) -> None:
    """The JSON-schema subset SCHEMAS use (a failure raises AssertionError naming it)."""
    if "enum" in schema:
        assert value in schema["enum"], (value, schema)
        return
    kind = schema["type"]
    if kind == "object":
        assert isinstance(value, dict) and set(schema["required"]) <= set(value), (value, schema)
        assert set(value) <= set(schema["properties"]), value
        for key, item in value.items():
            validate(item, schema["properties"][key])
    elif kind == "array":
        assert isinstance(value, list) and schema["minItems"] <= len(value) <= schema["maxItems"], (
            value
        )
        for item in value:
            validate(item, schema["items"])
    elif kind == "string":
        assert isinstance(value, str) and len(value) <= schema["maxLength"], value
    elif kind == "integer":
        assert isinstance(value, int) and not isinstance(value, bool), value
        assert schema["minimum"] <= value <= schema["maximum"], value
    elif kind == "boolean":
        assert isinstance(value, bool), value


def _llm(drafter: str, **kwargs) -> LLM:
    return LLM(
        ZOO + "tinypy",
        device=DEVICE,
        dtype="float32",
        num_kv_blocks=512,
        max_num_seqs=32,
        speculative=DRAFTERS[drafter],
        **kwargs,
    )


@pytest.mark.parametrize("drafter", list(DRAFTERS))
def test_sampled_json_schemas_parse_and_validate(drafter):
    llm = _llm(drafter)
    params = [
        SamplingParams(
            temperature=1.0,
            seed=i,
            max_tokens=64,
            structured_outputs=StructuredOutputsParams(json=SCHEMAS[i % len(SCHEMAS)]),
        )
        for i in range(PER_DRAFTER)
    ]
    outs = llm.generate([PROMPTS[i % len(PROMPTS)] for i in range(PER_DRAFTER)], params)
    for i, out in enumerate(outs):
        assert out.finish_reason == "stop", (i, out.text)
        assert (
            out.token_ids[-1] in llm.engine.eos_token_ids
        )  # the grammar's end, and nothing after it
        validate(json.loads(out.text), SCHEMAS[i % len(SCHEMAS)])
    if drafter != "none":
        accepted = sum(o.spec_metrics.num_accepted_drafts for o in outs)
        assert accepted > len(outs), (
            f"{drafter}: {accepted} drafts accepted in {len(outs)} requests"
        )
    assert llm.engine.pool.num_free == 512


@pytest.mark.parametrize("drafter", ["eagle3-chain", "eagle3-tree", "ngram"])
def test_greedy_constrained_output_equals_plain(drafter):
    """Greedy constrained decoding is lossless too: the same text with and without speculation, for a
    regex, a choice, an EBNF grammar and json_object."""
    specs = [
        StructuredOutputsParams(regex=r"(0|[1-9][0-9]{0,3})\.[0-9]{2}"),
        StructuredOutputsParams(choice=["return None", "return x + 1", "pass"]),
        StructuredOutputsParams(
            grammar='root ::= "x = " num ("," num)? ("," num)?\nnum ::= [0-9] | [1-9] [0-9]'
        ),
        StructuredOutputsParams(json_object=True),
    ]
    params = [SamplingParams(temperature=0, max_tokens=40, structured_outputs=s) for s in specs]
    prompts = ["price = ", "def f(x):\n    ", "x = [", "d = "]
    plain = [o.text for o in _llm("none").generate(prompts, params)]
    assert re.fullmatch(r"(0|[1-9][0-9]{0,3})\.[0-9]{2}", plain[0])
    assert plain[1] in ("return None", "return x + 1", "pass")
    assert re.fullmatch(r"x = ([0-9]|[1-9][0-9])(,([0-9]|[1-9][0-9])){0,2}", plain[2])
    assert isinstance(json.loads(plain[3]), dict)
    assert [o.text for o in _llm(drafter).generate(prompts, params)] == plain


def test_a_batchs_masks_build_only_its_constrained_rows():
    """``GrammarTable.tree_masks`` writes every row of its output: a constrained row its grammar's masks, any other
    row (unconstrained, padding) every token allowed, whatever the buffer held before (a row of the step before
    may have been constrained); only the constrained rows' masks are built on the host."""
    from transformers import AutoTokenizer

    from outpace.request import Request
    from outpace.structured.table import GrammarTable

    tok = AutoTokenizer.from_pretrained(ZOO + "tinypy")
    table = GrammarTable(GrammarCompiler(tok, 4096, [0]))
    constraint = StructuredOutputsParams(regex="ab(c|d)e")
    reqs = [
        Request("free", [1], SamplingParams()),
        Request("regex", [1], SamplingParams(structured_outputs=constraint)),
    ]
    a, b = tok.convert_tokens_to_ids("a"), tok.convert_tokens_to_ids("b")
    tokens, parents = (
        torch.tensor([[a, b]] * 3),
        torch.tensor([[-1, 0]] * 3),
    )  # rows: free, regex, padding
    out = torch.zeros(3, 2, table.mask_words, dtype=torch.int32)
    built = []
    fill = type(table.get(reqs[1])).fill_tree
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(
            type(table.get(reqs[1])), "fill_tree", lambda g, *a: built.append(1) or fill(g, *a)
        )
        assert table.tree_masks(reqs, tokens, parents, out) is out
    want = torch.full((2, table.mask_words), -1, dtype=torch.int32)
    table.get(reqs[1]).fill_tree([a, b], [-1, 0], want)
    assert built == [1]
    assert torch.equal(out[1], want) and not torch.equal(want, torch.full_like(want, -1))
    assert (out[0] == -1).all() and (out[2] == -1).all()


def test_draft_leaving_the_grammar_is_rejected_there_and_state_rolls_back():
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(ZOO + "tinypy")
    compiler = GrammarCompiler(tok, 4096, [0])
    grammar = compiler.matcher(StructuredOutputsParams(regex="ab(c|d)e"))
    a, b, c, x = (tok.convert_tokens_to_ids(t) for t in "abcx")
    grammar.accept([a])
    before = torch.zeros(1, 128, dtype=torch.int32)
    grammar.fill_tree([a], [-1], before)
    # chain a | b, x, c: draft 2 (x) leaves the grammar
    masks = torch.zeros(4, 128, dtype=torch.int32)
    grammar.fill_tree([a, b, x, c], [-1, 0, 1, 2], masks)
    after = torch.zeros(1, 128, dtype=torch.int32)
    grammar.fill_tree([a], [-1], after)
    assert torch.equal(before, after) and torch.equal(before[0], masks[0]), (
        "drafts must be rolled back"
    )
    logits = torch.full((1, 4, 4096), -5.0)
    for pos, tok_id in enumerate([b, x, c, a]):  # the raw target agrees with every draft
        logits[0, pos, tok_id] = 5.0
    assert verify_greedy_chain(torch.tensor([[b, x, c]]), logits).num_correct_drafts.item() == 3
    masked = apply_token_bitmask(logits, masks[None])
    result = verify_greedy_chain(torch.tensor([[b, x, c]]), masked)
    assert result.num_correct_drafts.item() == 1  # b accepted, x rejected at its position
    assert result.bonus_token_ids.item() in (c, tok.convert_tokens_to_ids("d"))
    # the grammar complete (after e) or ended (after the stop token 0): the stop token alone
    e = tok.convert_tokens_to_ids("e")
    ends = torch.zeros(6, 128, dtype=torch.int32)
    grammar.fill_tree([a, b, c, e, 0, a], [-1, 0, 1, 2, 3, 4], ends)
    assert ends[3].tolist() == ends[4].tolist() == [1] + [0] * 127
    assert ends[5].tolist() == [-1] * 128  # a draft past the stop token: unreachable, so anything


def test_bad_constraints_are_refused_by_name():
    llm = _llm("none")
    with pytest.raises(ValueError, match="structured_outputs.json does not compile"):
        llm.generate(
            "x = ", SamplingParams(structured_outputs=StructuredOutputsParams(json='{"type": 5}'))
        )
    with pytest.raises(ValueError, match="structured_outputs.grammar does not compile"):
        llm.generate(
            "x = ", SamplingParams(structured_outputs=StructuredOutputsParams(grammar="root ::= ("))
        )
    assert not llm.engine.has_unfinished_requests
    with pytest.raises(ConfigError, match="exactly one of"):
        StructuredOutputsParams(regex="a", choice=["b"])
    with pytest.raises(ConfigError, match="SamplingParams.ignore_eos"):
        SamplingParams(
            ignore_eos=True, structured_outputs=StructuredOutputsParams(json_object=True)
        )


def gated_case(llm: LLM, prompt: str) -> tuple[str, int]:
    """A marker the free greedy output of ``prompt`` writes as its own tokens (text the tokenizer encodes as
    it was generated), and the output tokens up to its end."""
    free = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))[0]
    tok, ids = llm.tokenizer, free.token_ids
    for start in range(2, 8):
        text = tok.decode(ids[start : start + 2])
        if tok.encode(text, add_special_tokens=False) == ids[start : start + 2]:
            return text, start + 2
    raise AssertionError("no marker found in the free output")


@pytest.mark.parametrize("drafter", list(DRAFTERS))
def test_a_constraint_after_a_marker_leaves_the_text_before_it_free(drafter):
    """``starts_after`` (a reasoning model's "</think>"): the output up to the marker is the unconstrained
    greedy one, then the constraint holds; with every drafter, the same tokens (gated draft masks)."""
    plain = _llm("none")
    prompt = "def add(a, b):\n"
    marker, cut = gated_case(plain, prompt)
    free = plain.generate([prompt], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    spec = StructuredOutputsParams(choice=["yes", "no"], starts_after=marker)
    params = SamplingParams(temperature=0, max_tokens=30, structured_outputs=spec)
    want = plain.generate([prompt], params)[0]
    assert want.token_ids[:cut] == free[0].token_ids[:cut]
    tail = plain.tokenizer.decode(want.token_ids[cut:], skip_special_tokens=True)
    assert tail in ("yes", "no") and want.finish_reason == "stop"
    assert _llm(drafter).generate([prompt], params)[0].token_ids == want.token_ids


def test_a_gated_grammars_masks_allow_anything_until_the_marker():
    llm = _llm("none")
    tok = llm.tokenizer
    compiler = GrammarCompiler(tok, llm.engine.model_config.vocab_size, [0])
    marker = tok.encode("</think>", add_special_tokens=False)
    spec = StructuredOutputsParams(choice=["yes"], starts_after="</think>")
    words = compiler.matcher(spec).inner.words
    thinking = tok.encode("hm", add_special_tokens=False)
    grammar = compiler.matcher(spec, thinking + marker[:1])  # the marker begun, not ended
    path = [0, *marker[1:]]  # node 0 (committed), then the marker's rest as a chain of drafts
    parents = list(range(-1, len(path) - 1))
    masks = torch.zeros(len(path), words, dtype=torch.int32)
    grammar.fill_tree(path, parents, masks)
    assert (masks[:-1] == -1).all()  # inside the marker: anything
    yes = tok.encode("yes", add_special_tokens=False)[0]
    assert (masks[-1] != -1).any() and masks[-1][yes // 32] & (1 << (yes % 32)) != 0
    grammar.accept(marker[1:])  # committed: the grammar is open, its mask that of "yes"
    opened = torch.zeros(1, words, dtype=torch.int32)
    grammar.fill_tree([0], [-1], opened)
    assert torch.equal(opened[0], masks[-1])
    with pytest.raises(ConfigError, match="starts_after"):
        StructuredOutputsParams(choice=["yes"], starts_after="")


def test_a_choice_beyond_the_basic_plane_writes_valid_utf8():
    """A choice escaped as JSON's surrogate pair ("\\ud83d\\udc0d") was two code points to the grammar: the
    model wrote bytes ED A0 BD ..., no character."""
    params = SamplingParams(
        temperature=0, max_tokens=12, structured_outputs=StructuredOutputsParams(choice=["🐍 ok"])
    )
    assert _llm("none").generate(["x = "], params)[0].text == "🐍 ok"
