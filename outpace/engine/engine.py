"""The step loop: admit requests, schedule, run, append tokens, detect stops, return outputs.

``LLMEngine._build`` assembles the parts (tokenizer, target, pool, proposer, runner, scheduler) from the
start-up jobs of engine/start_up.py, in the order that file explains.

Tensor parallelism (``EngineConfig.tensor_parallel_size`` > 1): every rank holds an engine whose model
is this rank's shard (built inside ``building_in``); rank 0's takes requests and returns outputs, and
at each step sends the other ranks what changed, so every rank schedules and runs the same step
(distributed/lockstep.py). The other ranks run ``follow`` instead of being called.
"""

from __future__ import annotations

import itertools
import logging
import numbers
import time
import weakref
from typing import Callable, Sequence

import torch

from outpace.attention.registry import resolve_backend_name
from outpace.cache.prefix_cache import PrefixCacheStats
from outpace.config import EngineConfig
from outpace.detokenizer import final_text, update_text
from outpace.distributed.group import building_in
from outpace.distributed.launch import Ranks, join_ranks
from outpace.distributed.lockstep import Lockstep, requests_of
from outpace.engine.prefill_graphs import prefill_buckets
from outpace.engine.runner import ModelRunner
from outpace.engine.scheduler import ScheduledRequest, Scheduler, is_decoding
from outpace.engine.start_up import (
    build_choosers,
    build_proposer,
    check_before_loading,
    check_decode_fits_a_batch,
    context_limit,
    decode_buckets,
    eos_token_ids,
    kv_cache_dtype,
    load_target,
    load_tokenizer,
    provisional_pool,
    report,
    request_rows,
    set_up_prefix_cache,
    size_kv_pool,
)
from outpace.engine.step_results import StepResults
from outpace.engine.warm_up import warm_up_prefills
from outpace.model_config import ModelConfig
from outpace.models.loader import resolve_dtype
from outpace.request import Request, RequestOutput
from outpace.sampling_params import SamplingParams
from outpace.speculative.metrics import SpecMetrics
from outpace.structured import GrammarCompiler, GrammarTable
from outpace.validation import RequestFieldError

logger = logging.getLogger("outpace.engine")


def _token_ids(prompt: Sequence) -> list[int]:
    """A prompt given as token ids: integers only (not bools, floats or strings, which int() would take)."""
    for i, t in enumerate(prompt):
        if isinstance(t, bool) or not isinstance(t, numbers.Integral):
            raise ValueError(
                f"prompt token id {i} is {t!r} ({type(t).__name__}): token ids must be integers"
            )
    return [int(t) for t in prompt]


def _undrafted_metrics(batch: list, results: StepResults) -> list[SpecMetrics]:
    """The speculative metrics of the batch's requests whose decode step verified no draft (adaptive speculation
    drafting nothing): ``SpecMetrics.record_undrafted`` counts them at once, so that such a step runs no Python
    per request beyond what plain decoding's runs (tests/speculative/test_zero_draft_host.py)."""
    return [
        s.request.spec_metrics
        for s, accepted, drafts in zip(batch, results.num_accepted_drafts, results.num_drafts)
        if accepted is not None and not drafts
    ]


def close_ranks(
    lockstep: Lockstep | None, ranks: Ranks, release_graphs: Callable[[], None]
) -> None:
    """Tell the other ranks the engine closes (``lockstep``: rank 0's, None elsewhere), free this rank's CUDA
    graphs (``release_graphs``: their captured collectives would keep the process group from being
    destroyed), wait for every rank to get there (``Ranks.leave_together``), then release our rank."""
    if ranks.closed:
        return
    try:
        if lockstep is not None:
            lockstep.stop()
        if ranks.group.size > 1:
            release_graphs()
            ranks.leave_together()
    finally:
        ranks.close()


class LLMEngine:
    def __init__(
        self, config: EngineConfig, progress: bool = True, ranks: Ranks | None = None
    ) -> None:
        """``ranks``: this process's rank of a tensor-parallel engine (distributed/launch.py); by default
        joined from ``config`` (and with more than one, the other ranks started or awaited)."""
        self.ranks = ranks if ranks is not None else join_ranks(config)
        self.lockstep = Lockstep(self.ranks.group) if self.ranks.group.size > 1 else None
        self._failure: BaseException | None = None
        try:
            with building_in(self.ranks.group):
                self._build(config, progress)
        except BaseException:
            if self.ranks.group.size > 1 and hasattr(self, "runner"):
                self.runner.release_graphs()  # (close_ranks says why)
            self.ranks.close()
            raise
        # (the finalizer holds the runner, which holds no reference to the engine: collecting the engine
        # closes the ranks)
        driver = self.lockstep is not None and self.ranks.group.is_driver
        self._closer = weakref.finalize(
            self,
            close_ranks,
            self.lockstep if driver else None,
            self.ranks,
            self.runner.release_graphs,
        )

    def _build(self, config: EngineConfig, progress: bool) -> None:
        """The engine's parts, built in an order that matters (engine/start_up.py says why)."""
        self.config = config
        self.model_config = ModelConfig.from_pretrained(config.model)
        max_pos = self.model_config.max_position_embeddings
        spec = config.speculative
        check_before_loading(config, self.model_config)
        self.tokenizer = load_tokenizer(
            config.tokenizer or config.model, given=bool(config.tokenizer)
        )
        torch.manual_seed(config.seed)  # (before the models: a dummy load's weights follow it)
        self._seeds = torch.Generator().manual_seed(config.seed)  # unseeded requests' seeds
        dtype = resolve_dtype(config.dtype, self.model_config, config.device)
        self.model = load_target(config, self.model_config, dtype, progress)
        kv_dtype = kv_cache_dtype(config, self.model_config, self.model, dtype, progress)
        self.pool = provisional_pool(config, max_pos)
        backend = resolve_backend_name(config.attention_backend, config.device)
        self.proposer, shapes, lookahead = build_proposer(
            config, self.model, self.pool, dtype, backend, max_pos
        )
        # NOTE: with speculation the lookahead + 1 rows after a request's last token are kept for its drafts,
        # also past the end of the context (rotary tables cover POSITIONS_PAST_CONTEXT more positions).
        reserved = lookahead + 1 if spec.enabled else 0
        rows = request_rows(config, max_pos, reserved)
        self.choosers = build_choosers(shapes, self.ranks.group)
        self.eos_token_ids = eos_token_ids(self.model_config, self.tokenizer, config.model)
        self.grammars = GrammarTable(
            GrammarCompiler(self.tokenizer, self.model_config.vocab_size, self.eos_token_ids)
        )
        self.runner = ModelRunner(
            self.model,
            self.pool,
            kv_dtype,
            config.device,
            backend,
            config.max_num_seqs,
            rows,
            self.proposer,
            shapes,
            self.choosers,
            self.grammars,
            config.batch_invariant,
            state_dtype=dtype,
            eos_token_ids=tuple(sorted(self.eos_token_ids)),
        )
        decode_tokens = shapes[-1].num_nodes
        check_decode_fits_a_batch(config, decode_tokens)
        # (before sizing: a hybrid's state checkpoints are memory the KV pool cannot have)
        self.prefix_caching_off_reason, checkpoints = set_up_prefix_cache(
            config, self.runner, self.proposer, self.pool
        )
        self.memory_plan = None
        if config.kv_blocks_from_memory:
            self.memory_plan = size_kv_pool(
                config,
                self.runner,
                self.pool,
                self.ranks.group,
                max_pos,
                decode_tokens,
                reserved,
                progress,
            )
        self.scheduler = Scheduler(
            self.pool,
            config.max_num_seqs,
            config.max_num_batched_tokens,
            decode_tokens,
            lookahead,
            on_free=self._on_free,
            unsettled_rows=self.proposer.unsettled_rows if spec.enabled else 0,
            checkpoints=checkpoints,
        )
        self._context_limit, self.max_model_len = context_limit(
            config, max_pos, self.pool, reserved, progress
        )
        on_gpu = config.device.startswith("cuda")
        if on_gpu and config.cuda_graphs:
            self.capture_graphs()
        if on_gpu:  # compile the eager prefill's kernel variants now, not in the first requests (engine/warm_up.py)
            warm_up_prefills(
                self.runner,
                self.pool,
                config.max_num_seqs,
                config.max_num_batched_tokens,
                self.max_model_len,
            )
        self._requests: dict[str, Request] = {}
        self._ids = itertools.count()
        self.stream_outputs = False  # step() also reports unfinished requests that got tokens

    def capture_graphs(self) -> None:
        """Capture the decode iteration for every batch bucket (``cuda_graph_sizes``, by default a ladder up to
        max_num_seqs; either way none larger than a decode step can be: engine/start_up.py ``decode_buckets``), and
        a lone prefill chunk's forward for every prefill bucket. Done at start-up on CUDA unless ``cuda_graphs`` is
        off; on the CPU the same code runs eagerly (for tests)."""
        reserved = (
            torch.cuda.memory_reserved(self.runner.device)
            if self.runner.device.type == "cuda"
            else 0
        )
        config = self.config
        self.runner.capture(
            decode_buckets(
                config, self.scheduler.decode_tokens, self.runner.has_recurrent_state, warn=True
            ),
            prefill_buckets(config.max_num_batched_tokens),
        )
        if self.memory_plan is not None and self.runner.device.type == "cuda":
            taken = torch.cuda.memory_reserved(self.runner.device) - reserved
            report(
                f"CUDA graphs took {taken / (1 << 30):.3f} GiB (sizing estimated "
                f"{self.memory_plan.graphs / (1 << 30):.3f} GiB)",
                False,
            )
        if self.config.run_ahead:
            self.runner.enable_run_ahead(self.max_model_len)

    # ---- admission -------------------------------------------------------------------------
    def add_request(
        self,
        prompt: str | Sequence[int],
        params: SamplingParams | None = None,
        request_id: str | None = None,
    ) -> str:
        """Validate and queue a request. Raises ValueError naming the problem; nothing else changes."""
        return self.submit(self.new_request(prompt, params, request_id))

    def submit(self, req: Request) -> str:
        if req.request_id in self._requests:
            raise ValueError(f"request id {req.request_id!r} is already in use")
        if self.lockstep is not None and self.ranks.group.is_driver:
            self.lockstep.added(req)
        self._requests[req.request_id] = req
        self.scheduler.add(req)
        return req.request_id

    def new_request(
        self,
        prompt: str | Sequence[int],
        params: SamplingParams | None = None,
        request_id: str | None = None,
    ) -> Request:
        """A validated request, not yet queued (so a batch can be checked before any of it runs)."""
        params = params or SamplingParams()
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be SamplingParams, got {type(params).__name__}")
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError(
                    f"model {self.config.model} has no tokenizer: pass the prompt as token ids"
                )
            token_ids = self.tokenizer.encode(prompt, add_special_tokens=True)
            text = prompt
        else:
            token_ids, text = _token_ids(prompt), None
        if not token_ids:
            raise ValueError("prompt is empty: at least one token is needed")
        bad = [t for t in token_ids if not 0 <= t < self.model_config.vocab_size]
        if bad:
            raise ValueError(
                f"prompt token ids {bad[:5]} are outside the vocabulary [0, {self.model_config.vocab_size})"
            )
        if len(token_ids) >= self.max_model_len:
            raise ValueError(
                f"prompt has {len(token_ids)} tokens, the context holds {self.max_model_len} (set by "
                f"{self._context_limit}): "
                f"at most {self.max_model_len - 1} prompt tokens leave room to generate"
            )
        self._check_room(len(token_ids), params.max_tokens)
        if request_id is None:  # (one no request holds: a caller's own ids may look like ours)
            request_id = next(i for i in map("req-{}".format, self._ids) if i not in self._requests)
        seed = (
            params.seed
            if params.seed is not None
            else int(torch.randint(1 << 62, (), generator=self._seeds))
        )
        req = Request(request_id, token_ids, params, prompt=text, seed=seed)
        self._check_features(req)
        return req

    def _check_room(self, num_prompt_tokens: int, max_tokens: int) -> None:
        """``max_tokens`` can be reached: within the context, and within the room the prompt leaves when the
        KV cache, not the model, sets the context (a limit the client cannot know; otherwise the output
        stops at the context with finish_reason "length", as vLLM's server clamps it)."""
        where = f"the context holds {self.max_model_len} tokens (set by {self._context_limit})"
        if max_tokens > self.max_model_len:
            raise RequestFieldError(
                "max_tokens", f"SamplingParams max_tokens={max_tokens} is more than {where}"
            )
        if (
            self._context_limit.startswith("the KV cache")
            and num_prompt_tokens + max_tokens > self.max_model_len
        ):
            raise RequestFieldError(
                "max_tokens",
                f"SamplingParams max_tokens={max_tokens} does not fit: the prompt has "
                f"{num_prompt_tokens} tokens and {where}; raise EngineConfig.num_kv_blocks",
            )

    def _check_features(self, req: Request) -> None:
        """What a request asks beyond plain sampling is possible here (ValueError naming what is not)."""
        p = req.params
        if p.n != 1 or p.best_of not in (None, 1):
            raise ValueError(
                f"SamplingParams n={p.n}, best_of={p.best_of}: an engine request is one sequence; "
                "LLM.generate (and the server) fan n and best_of out"
            )
        vocab = self.model_config.vocab_size
        for name, ids in (
            ("logit_bias", p.logit_bias or {}),
            ("stop_token_ids", p.stop_token_ids),
            ("allowed_token_ids", p.allowed_token_ids or ()),
        ):
            bad = [t for t in ids if t >= vocab]
            if bad:
                raise RequestFieldError(
                    name, f"{name} token ids {bad[:5]} are outside the vocabulary [0, {vocab})"
                )
        stops = self.eos_token_ids | set(p.stop_token_ids)
        if p.min_tokens and p.allowed_token_ids and stops.issuperset(p.allowed_token_ids):
            raise RequestFieldError(
                "min_tokens",
                f"SamplingParams min_tokens={p.min_tokens} leaves no token to sample: every one of "
                f"allowed_token_ids {list(p.allowed_token_ids)[:5]} is a stop token until then",
            )
        self.grammars.check(req)

    def abort_request(self, request_id: str) -> RequestOutput | None:
        req = self._requests.pop(request_id, None)
        if req is None:
            return None
        if self.lockstep is not None and self.ranks.group.is_driver:
            self.lockstep.aborted(request_id)
        self.scheduler.finish(req, "abort")
        req.metrics.finished_time = time.perf_counter()
        self._detokenize(req)
        return RequestOutput.of(req)

    @property
    def prefix_cache_stats(self) -> PrefixCacheStats | None:
        """Hits and queries of the prefix cache (None: caching is off)."""
        return self.pool.prefix_cache.stats if self.pool.prefix_cache is not None else None

    @property
    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished

    # ---- the step ----------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """One forward for the scheduled batch. Returns the requests that finished in it and, when
        ``stream_outputs`` is set, also those that got new tokens (``finished`` False, text so far)."""
        if self._failure is not None:
            raise RuntimeError(f"the engine stopped: {self._failure}") from self._failure
        if self.ranks.closed:
            raise RuntimeError("the engine was closed")
        batch = self._schedule()
        failed = [self._failed_output(req) for req in self._take_failed()]
        if self.lockstep is None:
            return failed + self._run(batch)
        try:
            self.lockstep.lead(batch)
            return failed + self._run(batch)
        except BaseException as e:
            # NOTE: a step that failed part-way leaves the ranks at different points: none can go on, so the
            # ranks this process started are stopped (torchrun's fail on the collective timeout)
            failure = self.ranks.failure(e)
            self._failure = failure or e
            self.ranks.close(timeout_s=1.0)
            if failure is None:
                raise
            raise failure from e

    def follow(self) -> None:
        """Ranks > 0: run rank 0's steps, each after applying the requests it added and aborted since the
        last, until it closes the engine; then close this rank's side (its graphs freed)."""
        while (message := self.lockstep.receive()) is not None:
            for op, arg in requests_of(message):
                self.submit(arg) if op == "add" else self.abort_request(arg)
            batch = self._schedule()
            self.lockstep.check(batch, message)
            self._run(batch)
        self.close()

    def _schedule(self) -> list[ScheduledRequest]:
        """The scheduler's next batch; for a hybrid target with a step run ahead, made to decode exactly the
        running requests that step ran for (engine/run_ahead.py ``RunAhead.reconcile``). The same on every rank."""
        batch = self.scheduler.schedule()
        ahead = self.runner.run_ahead
        if ahead is None or ahead.launch is None:
            return batch
        decoding = [s.request for s in batch if is_decoding(s.request)]
        missing, strangers = ahead.reconcile(decoding, self.scheduler.running)
        if strangers:
            batch = [s for s in batch if s.request not in strangers]
        added = [self.scheduler.decode_chunk(r) for r in missing]
        return batch + [s for s in added if s is not None]

    def close(self) -> None:
        """Rank 0 of a tensor-parallel engine: tell the other ranks to stop and wait for them (those this
        process started); also done when the engine is collected or the interpreter exits. Nothing to
        do for one rank; idempotent."""
        self._closer()

    def _take_failed(self) -> list[Request]:
        """The requests the scheduler failed since the last step (none other is affected)."""
        failed, self.scheduler.failed = self.scheduler.failed, []
        return failed

    def _run(self, batch) -> list[RequestOutput]:
        if not batch:
            return []
        try:
            results = self.runner.execute(batch, closed=not self.scheduler.waiting)
        except Exception as error:
            if self.lockstep is not None:  # the ranks would part ways: step() stops them all
                raise
            return self._isolate(batch, error)
        outputs = []
        now = time.perf_counter()
        SpecMetrics.record_undrafted(_undrafted_metrics(batch, results))
        at = 0  # the request's first new token
        for i, s in enumerate(batch):
            n = results.num_new_tokens[i]
            try:
                out = self._commit(s.request, results, i, at, now)
            except Exception as error:  # noqa: BLE001 - e.g. its stop strings: this request's failure alone
                out = self._fail(s.request, error)
            at += n
            if out is not None:
                outputs.append(out)
        return outputs

    def _commit(
        self, req: Request, results: StepResults, i: int, at: int, now: float
    ) -> RequestOutput | None:
        """Request ``i`` of the step: its committed rows, metrics and new tokens (``results.new_token_ids[at:]``).
        Returns its output when it finished (or, streaming, when it got tokens)."""
        n, accepted = results.num_new_tokens[i], results.num_accepted_drafts[i]
        req.num_computed_tokens += results.num_committed[i]
        self.scheduler.cleared(req)
        if (
            accepted is not None and results.num_drafts[i]
        ):  # (a verify of no draft: _run recorded it)
            budget = min(
                req.params.max_tokens - req.num_output_tokens, self.max_model_len - req.num_tokens
            )
            req.spec_metrics.record(
                results.num_drafts[i],
                results.max_depth[i],
                accepted,
                budget,
                results.draft_depths[i],
            )
        if n and req.metrics.first_token_time is None:
            req.metrics.first_token_time = now
        failure = self.grammars.failure(req)
        if failure is not None:  # its grammar's dead end (structured/grammar.py): it fails, alone
            raise failure
        stop = False
        for j in range(at, at + n):
            if results.logprobs is not None:
                req.record_logprobs(results.logprobs[j])
            if self._append_token(req, results.new_token_ids[j]):
                stop = True
                break
        self.scheduler.settle(req)  # its blocks' keys read the tokens just appended
        if stop:
            return self._finish(req)
        if self.stream_outputs and n:
            self._detokenize_so_far(req)
            return RequestOutput.of(req)
        return None

    def _isolate(self, batch: list, error: Exception) -> list[RequestOutput]:
        """The step of ``batch`` raised: a lone request is failed; otherwise which request caused it is not
        known, so the scheduler runs each of the batch's requests alone until it gets past this point
        (``Scheduler.isolate``: recomputation, so no other request's output changes)."""
        logger.exception("a step of %d requests failed", len(batch))
        if len(batch) == 1:
            return [self._fail(batch[0].request, error)]
        self.scheduler.isolate([s.request for s in batch])
        return []

    def _fail(self, req: Request, error: BaseException) -> RequestOutput:
        """End one request with ``error`` (Scheduler.fail); its output says why."""
        self.scheduler.fail(req, error)
        self.scheduler.failed.remove(req)  # (reported here, not at the next step)
        return self._failed_output(req)

    def _failed_output(self, req: Request) -> RequestOutput:
        """A failed request's output (finish_reason "error", ``error`` the cause; its text is not decoded,
        which may be what failed)."""
        logger.error("request %s failed: %s", req.request_id, req.error)
        self._requests.pop(req.request_id, None)
        req.metrics.finished_time = time.perf_counter()
        return RequestOutput.of(req)

    def _on_free(self, req: Request) -> None:
        self.runner.release(req.request_id)

    def _append_token(self, req: Request, token: int) -> bool:
        """Append one token; True when the request must stop (its reason recorded)."""
        req.token_ids.append(token)
        p = req.params
        if not p.ignore_eos and token in self.eos_token_ids:
            req.finish_reason, req.stop_reason = "stop", None
            return True
        if token in p.stop_token_ids:
            req.finish_reason, req.stop_reason = "stop", token
            return True
        num_tokens = len(req.token_ids)  # (num_tokens; less the prompt's, num_output_tokens)
        num_output = num_tokens - len(req.prompt_token_ids)
        if p.stop and self.tokenizer is not None:
            self._detokenize_so_far(req)
            # Only the new characters (and a stop string's length before them) are searched, as vLLM's
            # check_stop_strings does: a long output costs each token its new text, not the whole text again.
            stops = p.stop if num_output > p.min_tokens else ()  # (vLLM: once the output is longer)
            for s in stops:
                at = req.text.find(s, max(0, req.stop_search_from - len(s) + 1))
                if at >= 0:
                    req.text = req.text[: at + len(s) if p.include_stop_str_in_output else at]
                    req.finish_reason, req.stop_reason = "stop", s
                    return True
            req.stop_search_from = len(req.text)
        if num_output >= p.max_tokens or num_tokens >= self.max_model_len:
            req.finish_reason = "length"
            return True
        return False

    def _finish(self, req: Request) -> RequestOutput:
        reason = req.finish_reason
        self.scheduler.finish(req, reason)
        self._requests.pop(req.request_id, None)
        req.metrics.finished_time = time.perf_counter()
        if req.stop_reason is None or not isinstance(req.stop_reason, str):
            self._detokenize(req)
        return RequestOutput.of(req)

    def _detokenize_so_far(self, req: Request) -> None:
        if self.tokenizer is not None:
            req.text = update_text(
                self.tokenizer,
                req.output_token_ids,
                req.detokenizer,
                req.params.skip_special_tokens,
                req.prompt_token_ids,
            )

    def _detokenize(self, req: Request) -> None:
        """The final text. A token that stopped the request (EOS or a ``stop_token_ids`` one) stays in its
        token ids but not in its text, unless ``include_stop_str_in_output`` (vLLM's detokenizer: with
        ``skip_special_tokens`` off, "<|im_end|>" would otherwise end every answer), nor do the tokens of a
        character it left unfinished (detokenizer.py ``final_text``)."""
        if self.tokenizer is None:
            return
        ids, p = req.output_token_ids, req.params
        stopped_by_token = req.finish_reason == "stop" and not isinstance(req.stop_reason, str)
        if stopped_by_token and not p.include_stop_str_in_output:
            ids = ids[:-1]
        # (vLLM returns its incremental detokenizer's text: the stream is carried on, not decoded afresh)
        req.text = final_text(
            self.tokenizer, ids, p.skip_special_tokens, req.prompt_token_ids, req.detokenizer
        )
