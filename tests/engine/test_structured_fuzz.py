"""Structured output fuzzed through the offline API and the engine, as the project's rule asks of bad input: a
constraint that is malformed, or that no output can satisfy, is refused naming its field; one that runs into a
dead end part-way fails that request alone; the other requests of its batch (constrained or not, with every kind
of drafter) finish with the tokens they get alone, and no KV block, request row or grammar state is left held."""

from __future__ import annotations

import json
import re

import pytest
import torch

pytest.importorskip("xgrammar")

from helpers.zoo_drafters import zoo_drafters, zoo_llm  # noqa: E402
from outpace import SamplingParams  # noqa: E402
from outpace.sampling_params import StructuredOutputsParams  # noqa: E402
from outpace.structured import GrammarCompiler  # noqa: E402
from outpace.validation import ConfigError  # noqa: E402

EOS = 0  # zoo/tinypy's eos_token_id
DRAFTERS = {"none": None, **zoo_drafters(chain_steps=3, tree=(3, 2, 6))}
SPECULATIVE = ["ngram", "eagle3-chain", "eagle3-tree"]


def _nested(depth: int) -> dict:
    schema = {"type": "integer"}
    for _ in range(depth):
        schema = {"type": "array", "items": schema}
    return schema


# (the constraint, the field the error names, what it says): refused by StructuredOutputsParams itself
MALFORMED = [
    (
        {"choice": "yes"},
        "choice",
        "a non-empty list",
    ),  # used to become the choice of 'y', 'e' or 's'
    ({"choice": {"yes": 1}}, "choice", "a non-empty list"),
    ({"choice": []}, "choice", "a non-empty list"),
    ({"choice": ["a", 1]}, "choice", "a non-empty list"),
    ({"json_object": 1}, "json_object", "a bool"),
    ({"json": [1, 2]}, "json", "a JSON schema"),
    ({"regex": ""}, "regex", "a non-empty string"),
    ({"grammar": "  "}, "grammar", "a non-empty string"),
    ({"regex": "a", "choice": ["b"]}, "exactly one of", "got regex, choice"),
    ({"json_object": False}, "exactly one of", "got none"),
]
# (the constraint, its kind, what the error says): refused when the engine admits the request
UNCOMPILABLE = [
    ({"json": '{"type": 5}'}, "json", ""),
    ({"json": "{"}, "json", "not valid JSON"),
    ({"json": "[1]"}, "json", "object or bool"),
    ({"json": {"type": "wat"}}, "json", "wat"),
    ({"json": {"enum": []}}, "json", "enum"),
    ({"json": {"type": "integer", "minimum": 5, "maximum": 1}}, "json", "minimum"),
    ({"json": {"$ref": "#/$defs/x"}}, "json", "cannot be resolved"),
    ({"json": {"$ref": "#"}}, "json", "no output satisfies it"),  # only itself: no value ends it
    ({"json": "false"}, "json", "cannot accept any value"),
    ({"json": _nested(150)}, "json", "nests more than 100 levels"),  # compiled for seconds
    ({"json": '{"items": ' * 5000 + "{}" + "}" * 5000}, "json", "nests more than 100 levels"),
    ({"json": {"type": "string", "pattern": "[a-z]{3000}"}}, "json", "internal check"),
    # keywords xgrammar compiles but does not enforce: refused by name, as vLLM's xgrammar backend refuses them
    ({"json": {"type": "integer", "multipleOf": 3}}, "json", "'multipleOf' (at /)"),
    (
        {"json": {"type": "object", "properties": {"a": {"type": "array", "uniqueItems": True}}}},
        "json",
        "'uniqueItems' (at /properties/a)",
    ),
    ({"json": {"type": "object", "patternProperties": {"^a": {}}}}, "json", "'patternProperties'"),
    ({"json": {"type": "string", "format": "credit-card"}}, "json", "format 'credit-card'"),
    ({"json": {"type": "string", "pattern": "a+", "maxLength": 3}}, "json", "maxLength"),
    ({"regex": "a("}, "regex", "parenthesis"),
    ({"regex": "(?=a)a"}, "regex", "Lookahead"),
    ({"regex": "[^\\x00-\\U0010FFFF]"}, "regex", "no output satisfies it"),
    ({"grammar": "root ::= ("}, "grammar", "EBNF"),
    ({"grammar": 'foo ::= "a"'}, "grammar", "root"),
    ({"grammar": "root ::= foo"}, "grammar", "foo"),
    ({"grammar": 'start: "a" | "b"'}, "grammar", "looks like a Lark grammar"),
]


def assert_nothing_held(engine) -> None:
    """Every KV block and request row is free and no grammar state is kept."""
    assert not engine.has_unfinished_requests
    assert engine.pool.num_free == engine.pool.num_blocks
    table = engine.runner.req_table
    assert not table.held_by and table.num_free == engine.config.max_num_seqs
    assert len(engine.grammars) == 0


@pytest.fixture(scope="module")
def llms():
    """One LLM per drafter, built on first use."""
    built = {}

    def get(name: str):
        if name not in built:
            built[name] = zoo_llm(DRAFTERS[name], num_kv_blocks=128)
        return built[name]

    return get


# The good requests of a batch: free and constrained, greedy and seeded.
GOOD_PROMPTS = ["def fibonacci(n):\n", "price = ", 'point = {"x": 3, "y": 4}\npoint = ']
GOOD = [
    SamplingParams(temperature=0, max_tokens=12, ignore_eos=True),
    SamplingParams(
        temperature=1.0,
        seed=11,
        max_tokens=12,
        structured_outputs=StructuredOutputsParams(regex=r"[1-9][0-9]{0,3}\.[0-9]{2}"),
    ),
    SamplingParams(
        temperature=0,
        max_tokens=24,
        structured_outputs=StructuredOutputsParams(
            json={
                "type": "object",
                "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
                "required": ["x", "y"],
            }
        ),
    ),
]


def alone(llm) -> list[list[int]]:
    return [llm.generate([p], sp)[0].token_ids for p, sp in zip(GOOD_PROMPTS, GOOD)]


@pytest.mark.parametrize(
    "constraint,field,says", MALFORMED, ids=[json.dumps(c)[:40] for c, _, _ in MALFORMED]
)
def test_malformed_constraints_are_refused_naming_the_field(constraint, field, says):
    with pytest.raises(ConfigError, match=re.escape(field) + ".*" + re.escape(says)):
        StructuredOutputsParams(**constraint)


@pytest.mark.parametrize(
    "constraint,kind,says", UNCOMPILABLE, ids=[json.dumps(c)[:40] for c, _, _ in UNCOMPILABLE]
)
def test_constraints_that_cannot_run_are_refused_in_a_batch_and_nothing_runs(
    llms, constraint, kind, says
):
    """LLM.generate with the bad request among good ones: a ValueError naming the prompt and the field (no
    xgrammar internals), before any request is queued."""
    llm = llms("none")
    bad = SamplingParams(max_tokens=8, structured_outputs=StructuredOutputsParams(**constraint))
    with pytest.raises(ValueError) as refused:
        llm.generate(GOOD_PROMPTS[:1] + ["x = "] + GOOD_PROMPTS[1:], GOOD[:1] + [bad] + GOOD[1:])
    message = str(refused.value)
    assert message.startswith(f"prompt 1: structured_outputs.{kind} does not compile: "), message
    assert says in message and ".cc:" not in message and "Check failed" not in message, message
    assert_nothing_held(llm.engine)


def test_keyword_names_in_properties_and_data_are_not_refused(llms):
    """Only keywords of a schema are checked: a property named "multipleOf", or one in an enum's value, runs."""
    schema = {
        "type": "object",
        "properties": {"multipleOf": {"enum": [{"uniqueItems": 1}]}},
        "required": ["multipleOf"],
    }
    sp = SamplingParams(
        temperature=0, max_tokens=40, structured_outputs=StructuredOutputsParams(json=schema)
    )
    output = llms("none").generate(["x = "], sp)[0]
    assert json.loads(output.text) == {"multipleOf": {"uniqueItems": 1}}, output.text


def test_an_empty_schema_allows_any_json_value(llms):
    """``json={}`` (any value, as vLLM reads it) used to raise StopIteration: its kind was found by truth."""
    spec = StructuredOutputsParams(json={})
    assert spec.kind == "json"
    params = SamplingParams(temperature=0, max_tokens=40, structured_outputs=spec)
    out = llms("none").generate(["x = "], params)[0]
    assert out.finish_reason in ("stop", "length") and out.error is None


@pytest.mark.parametrize("drafter", ["none", *SPECULATIVE])
def test_a_bad_request_added_while_others_run_leaves_them_as_alone(llms, drafter):
    """engine.add_request of bad constraints between steps of good requests: each is refused naming its field,
    the good ones finish with the tokens they get alone, and nothing is left held."""
    llm = llms(drafter)
    engine, want = llm.engine, alone(llm)
    ids = [engine.add_request(p, sp) for p, sp in zip(GOOD_PROMPTS, GOOD)]
    outs = {o.request_id: o for o in engine.step() if o.finished}
    assert engine.scheduler.running, "the good requests were meant to be running"
    for constraint, kind, _ in UNCOMPILABLE:
        params = SamplingParams(structured_outputs=StructuredOutputsParams(**constraint))
        with pytest.raises(ValueError, match=f"structured_outputs.{kind} does not compile"):
            engine.add_request("x = ", params)
    while engine.has_unfinished_requests:
        outs.update((o.request_id, o) for o in engine.step() if o.finished)
    assert [outs[i].token_ids for i in ids] == want
    assert_nothing_held(engine)


# Grammars that run into a dead end after their first characters: no token continues them there.
DEAD_ENDS = [
    ({"regex": "ab[^\\x00-\\U0010FFFF]"}, "regex"),
    ({"grammar": 'root ::= "abc" x\nx ::= x "b"'}, "grammar"),
]


@pytest.mark.parametrize("drafter", ["none", "ngram", "eagle3-tree"])
def test_a_dead_end_fails_its_request_alone_naming_the_field(llms, drafter):
    """The dead-end requests end with finish_reason "error" (vLLM's FINISHED_ERROR when a grammar refuses its
    tokens) and an error naming the constraint, greedy and sampled; the good requests of the batch finish as
    alone and are not preempted (the step is not failed, so no request is isolated and recomputed)."""
    llm = llms(drafter)
    want = alone(llm)
    bad = [
        SamplingParams(
            temperature=t, seed=3, max_tokens=12, structured_outputs=StructuredOutputsParams(**c)
        )
        for c, _ in DEAD_ENDS
        for t in (0, 1.0)
    ]
    outs = llm.generate(GOOD_PROMPTS + ["x = "] * len(bad), GOOD + bad)
    assert [o.token_ids for o in outs[: len(GOOD)]] == want
    assert all(o.metrics.num_preemptions == 0 for o in outs[: len(GOOD)])
    for out, (_, kind) in zip(outs[len(GOOD) :], [d for d in DEAD_ENDS for _ in (0, 1)]):
        assert out.finish_reason == "error", out
        assert f"GrammarDeadEnd: structured_outputs.{kind} allows no token after" in out.error
    assert_nothing_held(llm.engine)


def test_a_grammar_longer_than_max_tokens_stops_at_the_length(llms):
    """vLLM's finish_reason "length": the output is the grammar's beginning, its tokens all allowed."""
    choice = "a much longer answer than four tokens"
    params = SamplingParams(
        temperature=0, max_tokens=4, structured_outputs=StructuredOutputsParams(choice=[choice])
    )
    llm = llms("eagle3-chain")
    out = llm.generate(["x = "], params)[0]
    assert out.finish_reason == "length" and len(out.token_ids) == 4
    assert choice.startswith(out.text) and out.text
    assert_nothing_held(llm.engine)


@pytest.mark.parametrize("drafter", ["none", *SPECULATIVE])
def test_the_end_of_sequence_comes_only_where_the_grammar_may_end(llms, drafter):
    """A logit bias of +100 on EOS makes the model end wherever the mask lets it: the output still matches the
    whole regex (at least 5 letters), greedy and sampled, n=2 of best_of=3 too."""
    pattern = "[a-z]{5,20}"
    spec = StructuredOutputsParams(regex=pattern)
    params = [
        SamplingParams(
            temperature=0, max_tokens=24, logit_bias={EOS: 100}, structured_outputs=spec
        ),
        SamplingParams(
            n=2,
            best_of=3,
            temperature=1.0,
            seed=5,
            max_tokens=24,
            logit_bias={EOS: 100},
            structured_outputs=spec,
        ),
    ]
    llm = llms(drafter)
    outs = llm.generate(["name = ", "word = "], params)
    completions = [c for o in outs for c in o.outputs]
    assert len(completions) == 3
    for c in completions:
        assert c.finish_reason == "stop" and c.token_ids[-1] == EOS, c
        assert re.fullmatch(pattern, c.text), c.text
    assert_nothing_held(llm.engine)


def test_masks_allow_the_end_only_at_accepting_states(llms):
    """ "ab(c)?" along the chain a, b, c: after "a" no EOS; after "ab" EOS or "c"; after "abc" EOS alone."""
    tok = llms("none").tokenizer
    grammar = GrammarCompiler(tok, 4096, [EOS]).matcher(StructuredOutputsParams(regex="ab(c)?"))
    a, b, c = (tok.convert_tokens_to_ids(t) for t in "abc")
    masks = torch.zeros(4, grammar.words, dtype=torch.int32)
    grammar.fill_tree([EOS, a, b, c], [-1, 0, 1, 2], masks)

    def allowed(row: int) -> set[int]:
        return {t for t in range(4096) if masks[row, t // 32] >> (t % 32) & 1}

    assert EOS not in allowed(0) and a in allowed(0)
    assert allowed(1) == {b}
    assert {EOS, c} <= allowed(2) and b not in allowed(2)
    assert allowed(3) == {EOS}
