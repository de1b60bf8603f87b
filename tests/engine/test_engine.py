"""Continuous batching, chunked prefill, sampling parameters and stops (random model, CPU)."""

import pytest
import torch

from outpace import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)


def prompts(n, vocab=203):
    g = torch.Generator().manual_seed(0)
    return [torch.randint(0, vocab, (5 + 7 * i,), generator=g).tolist() for i in range(n)]


def test_batched_equals_one_at_a_time(llama_dir):
    ps = prompts(8)
    llm = LLM(str(llama_dir), block_size=4, num_kv_blocks=256)
    batched = [o.token_ids for o in llm.generate(ps, GREEDY)]
    alone = [llm.generate([p], GREEDY)[0].token_ids for p in ps]
    assert batched == alone
    assert llm.engine.pool.num_free == 256


def test_chunked_prefill_equals_whole_prefill(llama_dir):
    ps = prompts(6)
    whole = LLM(str(llama_dir), block_size=4, num_kv_blocks=256).generate(ps, GREEDY)
    chunked = LLM(
        str(llama_dir), block_size=4, num_kv_blocks=256, max_num_batched_tokens=7
    ).generate(ps, GREEDY)
    assert [o.token_ids for o in whole] == [o.token_ids for o in chunked]


def test_requests_join_between_steps(llama_dir):
    ps = prompts(4)
    llm = LLM(str(llama_dir), block_size=4, num_kv_blocks=256)
    expected = {i: llm.generate([p], GREEDY)[0].token_ids for i, p in enumerate(ps)}
    engine, done = llm.engine, {}
    ids = {engine.add_request(ps[0], GREEDY): 0}
    step = 0
    while engine.has_unfinished_requests or len(ids) < len(ps):
        if step % 3 == 0 and len(ids) < len(ps):
            ids[engine.add_request(ps[len(ids)], GREEDY)] = len(ids)
        for out in engine.step():
            done[ids[out.request_id]] = out.token_ids
        step += 1
    assert done == expected


def test_seeded_sampling_is_reproducible_and_batch_independent(llama_dir):
    ps = prompts(3)
    llm = LLM(str(llama_dir), block_size=4, num_kv_blocks=256)
    params = [
        SamplingParams(
            temperature=0.9, top_p=0.9, top_k=50, max_tokens=12, seed=100 + i, ignore_eos=True
        )
        for i in range(3)
    ]
    together = [o.token_ids for o in llm.generate(ps, params)]
    alone = [llm.generate([p], sp)[0].token_ids for p, sp in zip(ps, params)]
    assert together == alone
    unseeded = llm.generate(
        ps[:1] * 4, SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True)
    )
    assert len({tuple(o.token_ids) for o in unseeded}) > 1


def test_max_tokens_stop_token_ids_and_abort(llama_dir):
    llm = LLM(str(llama_dir), block_size=4, num_kv_blocks=256)
    p = prompts(1)[0]
    free_run = llm.generate([p], GREEDY)[0].token_ids
    stop_at = free_run[5]
    out = llm.generate([p], GREEDY.replace(stop_token_ids=(stop_at,)))[0]
    assert out.finish_reason == "stop" and out.stop_reason == stop_at
    assert out.token_ids == free_run[: free_run.index(stop_at) + 1]
    out = llm.generate([p], GREEDY.replace(max_tokens=3))[0]
    assert out.finish_reason == "length" and len(out.token_ids) == 3

    engine = llm.engine
    rid = engine.add_request(p, GREEDY)
    engine.step()
    aborted = engine.abort_request(rid)
    assert aborted.finish_reason == "abort" and not engine.has_unfinished_requests
    assert engine.pool.num_free == engine.pool.num_blocks


def test_eos_and_stop_strings_with_tokenizer(zoo_like_dir):
    llm = LLM(str(zoo_like_dir), block_size=4, num_kv_blocks=256)
    tok = llm.tokenizer
    free = llm.generate(
        ["def f(x):"], SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    )[0]
    assert free.text == tok.decode(free.token_ids, skip_special_tokens=True)
    if len(free.text.strip()) >= 4:
        stop = free.text.strip()[2:4]
        out = llm.generate(
            ["def f(x):"],
            SamplingParams(temperature=0, max_tokens=24, stop=[stop], ignore_eos=True),
        )[0]
        assert out.finish_reason == "stop" and out.stop_reason == stop
        assert stop not in out.text and free.text.startswith(out.text)


def test_streamed_outputs_grow_to_the_final_output(zoo_like_dir):
    llm = LLM(str(zoo_like_dir), block_size=4, num_kv_blocks=256)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    final = llm.generate(["def f(x):"], params)[0]
    engine = llm.engine
    engine.stream_outputs = True
    rid = engine.add_request("def f(x):", params)
    seen = []
    while engine.has_unfinished_requests:
        for out in engine.step():
            assert out.request_id == rid
            assert out.token_ids[: len(seen[-1].token_ids) if seen else 0] == (
                seen[-1].token_ids if seen else []
            )
            seen.append(out)
    assert [o.finished for o in seen] == [False] * (len(seen) - 1) + [True]
    assert seen[-1].token_ids == final.token_ids and seen[-1].text == final.text


class PythonOnly:
    """The zoo tokenizer seen without its Rust backend, as a Python ("slow") tokenizer is: vLLM detokenizes it
    through ``convert_tokens_to_string`` (SlowIncrementalDetokenizer), not a DecodeStream."""

    is_fast = False

    def __init__(self, tok) -> None:
        self.tok = tok

    def __len__(self) -> int:
        return len(self.tok)

    def __getattr__(self, name: str):
        if name == "backend_tokenizer":
            raise AttributeError(name)
        return getattr(self.tok, name)


@pytest.mark.parametrize("path", ["DecodeStream", "Python", "DecodeStream with space clean-up"])
def test_incremental_detokenization_matches_full_decode(path):
    """Random token streams (partial UTF-8 characters included) through the zoo tokenizer, on each path of
    ``update_text``: the Rust backend's DecodeStream (also where the tokenizer cleans up spaces after decoding, as
    vLLM does), and vLLM's Python path (a tokenizer without a backend)."""
    from pathlib import Path

    from transformers import AutoTokenizer

    from outpace.detokenizer import DetokenizerState, streaming_backend, update_text

    full_tok = AutoTokenizer.from_pretrained(Path(__file__).resolve().parents[2] / "zoo" / "tinypy")
    full_tok.clean_up_tokenization_spaces = path == "DecodeStream with space clean-up"
    tok = PythonOnly(full_tok) if path == "Python" else full_tok
    assert (streaming_backend(tok) is None) == (path == "Python")
    g = torch.Generator().manual_seed(0)
    emoji = full_tok.encode("→ 世界 🐍 é . ,")
    for trial in range(20):
        ids, state = [], DetokenizerState()
        for _ in range(60):
            n = int(torch.randint(1, 4, (1,), generator=g))
            ids += (
                emoji[:n]
                if trial % 2
                else torch.randint(0, full_tok.vocab_size, (n,), generator=g).tolist()
            )
            text = update_text(tok, ids, state)
            full = tok.decode(ids, skip_special_tokens=True)
            if not full.endswith("\ufffd"):
                assert text == full
            assert full.startswith(text) or "\ufffd" in full
