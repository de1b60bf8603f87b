import os
import sys
from pathlib import Path

import pytest
import torch

# Without a GPU, Triton kernels run in Triton's interpreter (numpy on the CPU), so CI still checks
# their logic. Must be set before any kernel module is imported.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def _interpret_dots_row_by_row() -> None:
    """Make the interpreter's ``tl.dot`` give each output row bits that depend only on that row's operands.

    The interpreter computes ``tl.dot`` with numpy's matmul, i.e. OpenBLAS, which picks its sgemm
    kernel per CPU at run time. With the Haswell and Zen kernels (CPUs with AVX2 and no AVX-512) a row
    gets other bits in a 16-row than in a 32-row tile (OPENBLAS_CORETYPE=Haswell shows it on any
    x86-64 machine: tests/kernels/test_interpreter_dot.py then fails without this), which is why the
    batch-invariant attention tests failed on some machines and not others. A GPU's MMA does not do
    that (the batch-invariant kernels rest on it: attention/invariant_attention.py), so the interpreter
    would test the BLAS of the machine rather than the kernels' own reduction order. Here each output
    element is the sum over k of a[i, k] * b[k, j] in increasing k, accumulated in the accumulator's
    dtype: one numpy reduction over a strided axis, which numpy walks in order, the same arithmetic
    for a row whatever the rows around it (tests/kernels/test_interpreter_dot.py checks it). With it, the
    bit-for-bit tests hold on any CPU under the pinned numpy and Triton (constraints.txt).
    """
    try:
        from triton.runtime.interpreter import InterpreterBuilder
    except ImportError:  # no Triton: the Triton tests skip
        return
    fp_dot = InterpreterBuilder.create_dot

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if (
            a.dtype.primitive_bitwidth == 8 or b.dtype.primitive_bitwidth == 8
        ):  # fp8/int8: the original
            return fp_dot(self, a, b, d, input_precision, max_num_imprecise_acc)
        acc = d.data.dtype
        products = (
            a.data.astype(acc)[..., :, :, None] * b.data.astype(acc)[..., None, :, :]
        )  # [..., M, K, N]
        return type(d)(products.sum(axis=-2, dtype=acc) + d.data, d.dtype.scalar)

    InterpreterBuilder.create_dot = create_dot


if os.environ.get("TRITON_INTERPRET") == "1":
    _interpret_dots_row_by_row()

sys.path.insert(0, str(Path(__file__).parent))

from helpers.hf_models import checkpoint_cache, make_hf_model, save_hf_model  # noqa: E402

# transformers' hybrid classes pick flash-linear-attention's (GPU-only) kernels for the delta rule, and
# mamba_ssm's / causal_conv1d's where installed, over their own torch code
# (``use_kernel_func_from_hub_with_fallback``); outpace depends on fla-core, so the references would run
# them on CPU tensors and fail. The tests' reference is transformers' torch code: each such function is
# swapped back for the torch function it wraps.
_REFERENCE_MODULES = ("qwen3_next", "qwen3_5", "qwen3_5_moe", "nemotron_h")


@pytest.fixture(scope="session", autouse=True)
def _transformers_reference_in_torch():
    import importlib

    with pytest.MonkeyPatch.context() as patch:
        for name in _REFERENCE_MODULES:
            try:
                module = importlib.import_module(f"transformers.models.{name}.modeling_{name}")
            except ImportError:
                continue
            for attr, fn in list(vars(module).items()):
                if (
                    callable(fn)
                    and hasattr(fn, "__wrapped__")
                    and getattr(fn, "__module__", None) == module.__name__
                ):
                    patch.setattr(module, attr, fn.__wrapped__)
        yield


@pytest.fixture(scope="session", autouse=True)
def _auto_device_is_the_cpu():
    """In the tests the engine's device 'auto' means the CPU, also on a machine with a GPU (and before
    any module-scoped fixture builds an engine): most tests state CPU float32 behaviour, exact
    equalities among them. Tests of the GPU name their device."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("outpace.config.default_device", lambda: "cpu")
        yield


def pytest_configure(config):
    """Under pytest-xdist, each worker gets its share of the cores for torch's and numpy's thread pools: set in the
    controller before it starts the workers, which inherit it (as do the ranks the distributed tests spawn). With
    pools as wide as the machine, two workers on two busy cores spent their time in each other's spin-waits:
    tests/engine/test_prefix_cache.py with -n 2 beside other work took 80-115 s with one thread a worker and was
    unfinished after 600 s with two (twice each)."""
    workers = getattr(config.option, "numprocesses", None)
    if isinstance(workers, int) and workers > 1 and not hasattr(config, "workerinput"):
        share = str(max(1, (os.cpu_count() or 1) // workers))
        for pool in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ.setdefault(pool, share)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def poisoned(monkeypatch):
    """The fused kernels' launchers (layers/fused_kernels.py) get output buffers that start as NaN, so an
    element a kernel does not write fails the test."""
    from outpace.layers import fused_kernels  # (imports Triton: only the tests that ask for it)

    empty = torch.empty

    def nan_empty(*args, **kwargs):
        out = empty(*args, **kwargs)
        return out.fill_(float("nan")) if out.is_floating_point() else out

    monkeypatch.setattr(fused_kernels.torch, "empty", nan_empty)


@pytest.fixture(scope="session")
def hf_checkpoints(tmp_path_factory):
    """variant -> (transformers model, directory of its saved checkpoint)."""
    return checkpoint_cache(tmp_path_factory, make_hf_model)


@pytest.fixture(scope="session")
def llama_dir(hf_checkpoints):
    return hf_checkpoints("llama")[1]


@pytest.fixture(scope="session")
def zoo_like_dir(tmp_path_factory):
    """A random Llama with a real byte-level BPE tokenizer trained on a few stdlib files."""
    import sysconfig

    from outpace.train.tokenizer import save_tokenizer, train_tokenizer

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    texts = [
        (stdlib / name).read_text()
        for name in ("textwrap.py", "string.py", "functools.py", "abc.py")
    ]
    tok = train_tokenizer(texts, vocab_size=400)
    model = make_hf_model("llama", vocab_size=tok.get_vocab_size(), eos_token_id=0)
    path = save_hf_model(model, tmp_path_factory.mktemp("zoo_like"))
    save_tokenizer(tok, path, model_max_length=512)
    return path


@pytest.fixture(scope="session")
def toy_eval_prompts(tmp_path_factory) -> str:
    """A held-out prompts file (zoo/eval_prompts.json's format) of two short code prompts, for toy training runs."""
    import json

    path = tmp_path_factory.mktemp("toy_prompts") / "eval_prompts.json"
    path.write_text(json.dumps({"prompts": ["def f(x):\n    return", "class A:\n    def"]}))
    return str(path)


@pytest.fixture(scope="session")
def peaked_target(tmp_path_factory):
    """Like zoo_like_dir (a random Llama with a real tokenizer whose <|mask|> is id 2), but with large initial
    weights so that its next-token distributions are peaked: something to learn. Built once for the DFlash
    tests and the training tests that read it (none writes into it)."""
    import sysconfig

    from outpace.train.tokenizer import save_tokenizer, train_tokenizer

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    tok = train_tokenizer(
        [(stdlib / name).read_text() for name in ("textwrap.py", "string.py", "abc.py")],
        vocab_size=400,
    )
    model = make_hf_model(
        "llama", vocab_size=tok.get_vocab_size(), eos_token_id=0, initializer_range=0.5
    )
    path = save_hf_model(model, tmp_path_factory.mktemp("peaked_target"))
    save_tokenizer(tok, path, model_max_length=512)
    return path


@pytest.fixture(scope="session")
def trained_toy_target(tmp_path_factory):
    """num_layers -> (directory, metrics) of ``TargetRecipe.toy(steps=30, num_layers=num_layers)`` trained on the
    CPU (two greedy samples), once per session: the same deterministic run that tests/train/test_train.py,
    test_train_mtp.py, test_train_eagle3.py and test_train_ranks.py each trained for themselves. Tests read the
    directory and never write into it (a test that changes a target copies it first: helpers/mtp_targets.py
    ``write_mtp_target``)."""
    from outpace.train.target import TargetRecipe, train_target

    cache = {}

    def get(num_layers: int):
        if num_layers not in cache:
            out = tmp_path_factory.mktemp(f"toy_target_{num_layers}_layers")
            cache[num_layers] = (
                out,
                train_target(
                    TargetRecipe.toy(steps=30, num_layers=num_layers), out, "cpu", num_samples=2
                ),
            )
        return cache[num_layers]

    return get


@pytest.fixture(scope="session")
def mtp_toy_target(trained_toy_target, tmp_path_factory):
    """helpers/mtp_targets.py's ``write_mtp_target`` over the two-layer toy target, built once for the MTP recipe's
    tests and the rank tests."""
    from helpers.mtp_targets import write_mtp_target

    return write_mtp_target(tmp_path_factory.mktemp("mtp_target"), trained_toy_target(2)[0])
