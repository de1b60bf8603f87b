"""Frozen, self-validating engine configuration: how the engine runs (``EngineConfig``) and which
drafter proposes tokens (``SpeculativeConfig``).

Every dataclass checks itself in ``__post_init__``; an invalid value raises ``ConfigError`` naming the
field, the value and the allowed range (outpace/validation.py). The CLI and the API only build these.
The model's own configuration is outpace/model_config.py; a request's, outpace/sampling_params.py.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from outpace.validation import (
    ConfigError,
    is_finite_number,
    is_int,
    is_int64,
    require,
    require_positive_int,
)


@dataclass(frozen=True)
class SpeculativeConfig:
    """Which drafter proposes tokens, and how many.

    ``num_steps`` autoregressive draft steps with ``topk`` branches each (topk 1: a chain);
    ``num_draft_tokens`` tokens are verified per step, the first being the last accepted token
    (a chain verifies num_steps + 1). None derives it: num_steps + 1 for a chain.
    ``adaptive``: each step chooses how many to draft, up to that shape (speculative/adaptive.py).
    None: adaptive unless num_steps or num_draft_tokens was given (then they fix the shape).
    """

    method: str = "none"
    draft: str | None = None
    num_steps: int | None = None  # None: the drafter's default (5; a DFlash draft's block_size - 1)
    adaptive: bool | None = None
    topk: int = 1
    num_draft_tokens: int | None = None
    ngram_min: int = 2  # n-gram lookup: shortest and longest suffix matched
    ngram_max: int = 4
    # a file of token ids: drafts read from the head's rows of these tokens alone (speculative/hot_vocab.py)
    token_map: str | None = None

    def __post_init__(self) -> None:
        from outpace.registry import PROPOSERS, proposer_class

        o = "SpeculativeConfig"
        require(
            o,
            "adaptive",
            self.adaptive,
            self.adaptive is None or isinstance(self.adaptive, bool),
            "true, false or None",
        )
        for name in ("draft", "token_map"):
            value = getattr(self, name)
            require(
                o,
                name,
                value,
                value is None or isinstance(value, (str, os.PathLike)),
                "a path or None",
            )
        if self.adaptive is None:
            object.__setattr__(
                self, "adaptive", self.num_steps is None and self.num_draft_tokens is None
            )
        methods = ("none", *PROPOSERS)
        require(o, "method", self.method, self.method in methods, f"one of {', '.join(methods)}")
        # (never ignored; a draft for a drafter that loads none is refused where the engine builds it)
        require(
            o,
            "draft",
            self.draft,
            self.draft is None or self.method != "none",
            "None with method 'none': no drafter loads it",
        )
        if self.method != "ngram":
            for name, default in (("ngram_min", 2), ("ngram_max", 4)):
                require(
                    o,
                    name,
                    getattr(self, name),
                    getattr(self, name) == default,
                    f"left at {default} with method {self.method!r}: only ngram matches n-grams",
                )
        if self.num_steps is None:  # the drafter's default for its draft (a DFlash draft's block)
            default = 5
            if self.method != "none" and self.draft is not None:
                default = proposer_class(self.method).default_num_steps(Path(self.draft))
            object.__setattr__(self, "num_steps", default)
        from outpace.layers.rotary import POSITIONS_PAST_CONTEXT

        # (each draft step reaches a row past the request's last token: refused here, before a drafter sized
        # for a million steps is allocated)
        most_steps = POSITIONS_PAST_CONTEXT - 1
        require(
            o,
            "num_steps",
            self.num_steps,
            is_int(self.num_steps) and 0 < self.num_steps <= most_steps,
            f"an integer in [1, {most_steps}] (drafts reach at most {most_steps} rows past a request's last "
            "token)",
        )
        require_positive_int(o, "topk", self.topk)
        if self.num_draft_tokens is None:
            object.__setattr__(
                self,
                "num_draft_tokens",
                self.num_steps + 1 if self.topk == 1 else min(1 + self.topk * self.num_steps, 16),
            )
        require_positive_int(o, "num_draft_tokens", self.num_draft_tokens)
        if self.topk == 1:
            require(
                o,
                "num_draft_tokens",
                self.num_draft_tokens,
                self.num_draft_tokens == self.num_steps + 1,
                f"num_steps + 1 = {self.num_steps + 1} for a chain (topk 1)",
            )
        else:
            most = 1 + self.topk + (self.num_steps - 1) * self.topk * self.topk
            require(
                o,
                "num_draft_tokens",
                self.num_draft_tokens,
                2 <= self.num_draft_tokens <= most,
                f"in [2, {most}] (1 + topk + (num_steps - 1) * topk^2 candidates) for topk {self.topk}",
            )
        require_positive_int(o, "ngram_min", self.ngram_min)
        require(
            o,
            "ngram_max",
            self.ngram_max,
            is_int(self.ngram_max) and self.ngram_max >= self.ngram_min,
            f"an integer >= ngram_min={self.ngram_min}",
        )

        if self.token_map is not None:
            takes = self.method != "none" and proposer_class(self.method).takes_token_map
            require(
                o,
                "token_map",
                self.token_map,
                takes,
                "given only with a drafter whose drafts read a head of the target's vocabulary (mtp, dflash), not "
                f"method {self.method!r}",
            )

    @property
    def enabled(self) -> bool:
        return self.method != "none"


def default_device() -> str:
    """What device 'auto' means here: 'cuda' when torch sees a GPU, else 'cpu'."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _resolve_device(device: str) -> str:
    """'auto' -> ``default_device()``; a CUDA device torch cannot use is refused."""
    import torch

    if device == "auto":
        return default_device()
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            build = (
                "a CPU-only build"
                if torch.version.cuda is None
                else f"built for CUDA {torch.version.cuda}"
            )
            raise ConfigError(
                f"EngineConfig.device={device!r} is invalid: torch {torch.__version__} ({build}) sees "
                f"no GPU here; use device 'cpu' or 'auto'"
            )
        index = device.partition(":")[2]
        require(
            "EngineConfig",
            "device",
            device,
            index == "" or (index.isdigit() and int(index) < torch.cuda.device_count()),
            f"'cuda' or 'cuda:N' with N < {torch.cuda.device_count()} (the GPUs torch sees)",
        )
    return device


# The longest dist_timeout (about 31 years): torch.distributed keeps deadlines in int64 nanoseconds, where a
# timeout of 2**63 ns (292 years) or more wraps round to one already past
MAX_TIMEOUT_S = 10**9
CPU_KV_BLOCKS = 512  # the CPU pool without num_kv_blocks or cpu_memory_utilization
GPU_MEMORY_UTILIZATION = 0.9  # the GPU's share without num_kv_blocks or gpu_memory_utilization


@dataclass(frozen=True)
class EngineConfig:
    """How the engine runs a model: device, precision, cache size and batching limits.

    ``num_kv_blocks`` of ``block_size`` tokens each form the paged KV pool; None sizes it from memory
    (engine/memory.py; the start-up log says what was chosen): on CUDA the engine may use
    ``gpu_memory_utilization`` (None: 0.9) of the GPU's memory in all (weights, activation
    workspace, CUDA graphs, state slots, KV); on the CPU, with ``cpu_memory_utilization`` set, that
    share of the RAM still available once the models are loaded, and without it ``CPU_KV_BLOCKS``
    blocks (small runs and tests start at once). A utilization given where it cannot apply (beside
    ``num_kv_blocks``, or for the other device) is refused.
    ``max_num_batched_tokens`` bounds the tokens of one forward (prefill is chunked to fit).
    ``enable_prefix_caching``: reuse full KV blocks across requests sharing a prefix (cache/prefix_cache.py);
    None turns it on wherever the models allow (not with recurrent drafts, whose state is not cached), True
    demands it (refused where it cannot work), False turns it off. A hybrid target's prefixes also need their
    recurrent state: ``num_state_checkpoints`` states saved at block boundaries (cache/state_checkpoints.py;
    None: ``max_num_seqs``, each a request's state in size; 0 turns prefix caching off for hybrid targets).
    """

    model: str
    tokenizer: str | None = None
    device: str = "auto"  # "auto": cuda when torch sees a GPU, else cpu (resolved at construction)
    dtype: str = "auto"
    seed: int = 0
    block_size: int = 16
    num_kv_blocks: int | None = None
    gpu_memory_utilization: float | None = None  # None: 0.9 (GPU_MEMORY_UTILIZATION) on CUDA
    cpu_memory_utilization: float | None = None
    enable_prefix_caching: bool | None = None
    num_state_checkpoints: int | None = None
    # The running batch's limit; one whose per-sequence rows (block tables, a hybrid's recurrent state) cannot fit in
    # memory is refused at start-up, naming the numbers (engine/memory.py ``refuse_too_many_seqs``).
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    max_model_len: int | None = None
    attention_backend: str = "auto"  # "auto": triton on CUDA, torch on the CPU
    # Capture the decode iteration at start-up (every bucket, draft shape, sampling mode); CUDA only.
    cuda_graphs: bool = True
    # The batch sizes captured (vLLM's --cuda-graph-sizes, SGLang's --cuda-graph-bs); None: 1, 2, 4, 8, 16, 32,
    # 48, 64, 96, 128, 192, 256 below the largest decode batch, and that batch (max_num_seqs, or fewer where the
    # token budget holds fewer decoding requests: engine/cuda_graphs.py ``largest_decode_batch``; given sizes
    # above it are dropped with a warning, as vLLM's). A batch above the largest runs eagerly. Refused with
    # cuda_graphs False (nothing is captured).
    cuda_graph_sizes: tuple[int, ...] | None = None
    # Captured decode steps (any drafter, any sampling) launch the next step before the host has read
    # the current step's tokens (its inputs are the slot state on the device), so the host's
    # scheduling overlaps the GPU's forward: engine/run_ahead.py (a hybrid's too, at any batch: its recurrent
    # state is not saved; the engine keeps the requests the step ran for in the next batch instead).
    run_ahead: bool = True
    # Deterministic mode: batch-invariant projections (layers/linear.py) and attention (the Triton
    # backend's invariant variant) on CUDA, so a verify forward and a decode step give each row the
    # same bits and greedy chain speculation can match plain decoding exactly in bf16 too.
    # Process-wide while an engine with it set exists; slower.
    batch_invariant: bool = False
    # The target's paged KV cache (and MLA's latent cache): "auto" in the model's dtype; "fp8" (alias
    # "fp8_e4m3", vLLM's and SGLang's --kv-cache-dtype spellings) in float8_e4m3fn with a per-layer k and v
    # scale, half the bytes per token, so twice the blocks (attention/kv_quant.py). Recurrent state and the
    # drafters' caches keep their own precision.
    kv_cache_dtype: str = "auto"
    speculative: SpeculativeConfig = field(default_factory=SpeculativeConfig)
    load_format: str = (
        "safetensors"  # "dummy": random weights of the checkpoint's shape (benchmarks)
    )
    # Ranks the model is sharded over (outpace/distributed/): one process each, started by outpace or by
    # torchrun; NCCL between GPUs, gloo between CPU processes.
    tensor_parallel_size: int = 1
    # Ranks the routed experts are placed on, whole (outpace/distributed/group.py): 1 (every expert on every
    # rank, its rows split under TP), tensor_parallel_size (EP = TP, vLLM's --enable-expert-parallel), or any
    # size with tensor_parallel_size 1 (attention and dense layers whole on every rank).
    expert_parallel_size: int = 1
    # Seconds a collective of several ranks waits for a rank that hangs before the engine stops naming it
    # (SGLang's --dist-timeout); a follower idle between steps waits for rank 0's next one without limit.
    dist_timeout: float = 300.0
    # The sampling defaults of requests that leave a field unset (outpace/generation_defaults.py, vLLM's flags of
    # these names): "auto" the model's generation_config.json, "vllm" none, or a folder holding one; the override's
    # keys (e.g. {"temperature": 0.6}) set over them.
    generation_config: str = "auto"
    override_generation_config: dict | None = None

    @property
    def world_size(self) -> int:
        """The engine's ranks: one process each."""
        return max(self.tensor_parallel_size, self.expert_parallel_size)

    @property
    def memory_utilization_field(self) -> str:
        """The field whose share of memory sizes the KV pool on this device."""
        return (
            "gpu_memory_utilization" if self.device.startswith("cuda") else "cpu_memory_utilization"
        )

    @property
    def memory_utilization(self) -> float | None:
        """The share of memory the KV pool is sized from (class docstring); None: a fixed pool."""
        if self.num_kv_blocks is not None:
            return None
        if self.device.startswith("cuda"):
            given = self.gpu_memory_utilization
            return GPU_MEMORY_UTILIZATION if given is None else given
        return self.cpu_memory_utilization

    @property
    def kv_blocks_from_memory(self) -> bool:
        """Whether the engine sizes the KV pool from memory (the class docstring)."""
        return self.memory_utilization is not None

    def _check_memory_utilization(self) -> None:
        """Each utilization given is a fraction in (0, 1] and sizes the pool: refused beside
        ``num_kv_blocks`` (which fixes its size) and on the device it is not for, never unused."""
        for name in ("gpu_memory_utilization", "cpu_memory_utilization"):
            value = getattr(self, name)
            require(
                "EngineConfig",
                name,
                value,
                value is None or (is_finite_number(value) and 0 < value <= 1),
                "a fraction in (0, 1]",
            )
            if value is None:
                continue
            if self.num_kv_blocks is not None:
                raise ConfigError(
                    f"EngineConfig.num_kv_blocks={self.num_kv_blocks} and "
                    f"EngineConfig.{name}={value!r} both size the KV pool: give one"
                )
            if name != self.memory_utilization_field:
                raise ConfigError(
                    f"EngineConfig.{name}={value!r} does not apply on device={self.device!r}: the "
                    f"pool there is sized by EngineConfig.{self.memory_utilization_field} (or "
                    f"num_kv_blocks)"
                )

    def _check_cuda_graph_sizes(self) -> None:
        """The sizes given are batch sizes in [1, max_num_seqs], kept sorted and unique; refused with
        ``cuda_graphs`` off (--enforce-eager), where no step is captured, never unused. (On the CPU they
        size the eagerly replayed steps of ``LLMEngine.capture_graphs``, which tests and benches call.)"""
        sizes = self.cuda_graph_sizes
        require(
            "EngineConfig",
            "cuda_graph_sizes",
            sizes,
            isinstance(sizes, (tuple, list))
            and len(sizes) > 0
            and all(is_int(n) and 0 < n <= self.max_num_seqs for n in sizes),
            f"None or batch sizes in [1, max_num_seqs={self.max_num_seqs}]",
        )
        if not self.cuda_graphs:
            raise ConfigError(
                f"EngineConfig.cuda_graph_sizes={tuple(sizes)!r} does not apply with "
                f"EngineConfig.cuda_graphs=False (--enforce-eager): no step is captured; leave "
                f"cuda_graph_sizes out or turn CUDA graphs on"
            )
        object.__setattr__(self, "cuda_graph_sizes", tuple(sorted(set(sizes))))

    def __post_init__(self) -> None:
        o = "EngineConfig"
        require(
            o,
            "model",
            self.model,
            isinstance(self.model, (str, os.PathLike)),
            "a checkpoint directory",
        )
        require(
            o,
            "device",
            self.device,
            isinstance(self.device, str)
            and (self.device in ("auto", "cpu") or self.device.startswith("cuda")),
            "'auto', 'cpu' or 'cuda[:N]'",
        )
        object.__setattr__(self, "device", _resolve_device(self.device))
        if self.speculative is None:  # no speculation, as vLLM's speculative_config=None
            object.__setattr__(self, "speculative", SpeculativeConfig())
        require(
            o,
            "speculative",
            self.speculative,
            isinstance(self.speculative, SpeculativeConfig),
            "a SpeculativeConfig or None",
        )
        require(
            o,
            "dtype",
            self.dtype,
            self.dtype in ("auto", "float32", "float16", "bfloat16"),
            "one of auto, float32, float16, bfloat16",
        )
        for name in ("block_size", "max_num_seqs", "max_num_batched_tokens"):
            require_positive_int(o, name, getattr(self, name))
        if self.num_kv_blocks is not None:
            require_positive_int(o, "num_kv_blocks", self.num_kv_blocks)
        self._check_memory_utilization()
        require(
            o,
            "enable_prefix_caching",
            self.enable_prefix_caching,
            self.enable_prefix_caching in (None, True, False),
            "None (on where supported), True or False",
        )
        require(
            o,
            "num_state_checkpoints",
            self.num_state_checkpoints,
            self.num_state_checkpoints is None
            or (
                isinstance(self.num_state_checkpoints, int)
                and not isinstance(self.num_state_checkpoints, bool)
                and self.num_state_checkpoints >= 0
            ),
            "None (max_num_seqs) or an integer >= 0",
        )
        if self.enable_prefix_caching is False and self.num_state_checkpoints:
            raise ConfigError(
                f"EngineConfig.num_state_checkpoints={self.num_state_checkpoints} does not apply with "
                "EngineConfig.enable_prefix_caching=False (--no-enable-prefix-caching): the checkpoints "
                "serve prefix caching alone; leave num_state_checkpoints out or turn prefix caching on"
            )
        require(
            o, "seed", self.seed, is_int64(self.seed) and self.seed >= 0, "an integer in [0, 2**63)"
        )
        require(  # (a context of one token holds a prompt and no room to generate: every request refused)
            o,
            "max_model_len",
            self.max_model_len,
            self.max_model_len is None or (is_int(self.max_model_len) and self.max_model_len >= 2),
            "None (the model's) or an integer >= 2: a prompt token and one to generate",
        )
        if self.cuda_graph_sizes is not None:
            self._check_cuda_graph_sizes()
        require(
            o,
            "attention_backend",
            self.attention_backend,
            self.attention_backend in ("auto", "torch", "triton"),
            "one of auto, torch, triton",
        )
        from outpace.attention.kv_quant import KV_CACHE_DTYPES

        require(
            o,
            "kv_cache_dtype",
            self.kv_cache_dtype,
            self.kv_cache_dtype in KV_CACHE_DTYPES,
            f"one of {', '.join(KV_CACHE_DTYPES)}",
        )
        require(
            o,
            "load_format",
            self.load_format,
            self.load_format in ("safetensors", "dummy"),
            "'safetensors' or 'dummy'",
        )
        require(
            o,
            "generation_config",
            self.generation_config,
            isinstance(self.generation_config, (str, os.PathLike)),
            "'auto', 'vllm' or a folder holding a generation_config.json",
        )
        require(
            o,
            "override_generation_config",
            self.override_generation_config,
            self.override_generation_config is None
            or isinstance(self.override_generation_config, dict),
            "None or a dict of generation_config.json keys",
        )
        require_positive_int(o, "tensor_parallel_size", self.tensor_parallel_size)
        require_positive_int(o, "expert_parallel_size", self.expert_parallel_size)
        require(
            o,
            "dist_timeout",
            self.dist_timeout,
            is_finite_number(self.dist_timeout) and 0 < self.dist_timeout <= MAX_TIMEOUT_S,
            f"a positive number of seconds, at most {MAX_TIMEOUT_S}",
        )
        tp, ep = self.tensor_parallel_size, self.expert_parallel_size
        require(
            o,
            "expert_parallel_size",
            ep,
            ep in (1, tp) or tp == 1,
            f"1, tensor_parallel_size={tp} (EP = TP), or any size with tensor_parallel_size 1: "
            f"tensor parallelism inside expert-parallel ranks is not supported",
        )
        require(
            o,
            "device",
            self.device,
            self.world_size == 1 or self.device in ("cpu", "cuda"),
            "'cpu' or 'cuda' with several ranks (each rank takes the GPU of its local rank)",
        )
