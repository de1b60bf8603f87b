import os
import sys
from pathlib import Path

import pytest
import torch

# Without a GPU, Triton kernels run in Triton's interpreter (numpy on the CPU), so CI still checks
# their logic. Must be set before any kernel module is imported.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

sys.path.insert(0, str(Path(__file__).parent))

from hf_models import make_hf_model, save_hf_model  # noqa: E402


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def hf_checkpoints(tmp_path_factory):
    """variant -> (transformers model, directory of its saved checkpoint)."""
    cache = {}

    def get(variant: str):
        if variant not in cache:
            model = make_hf_model(variant)
            cache[variant] = (model, save_hf_model(model, tmp_path_factory.mktemp(variant)))
        return cache[variant]

    return get


@pytest.fixture(scope="session")
def llama_dir(hf_checkpoints):
    return hf_checkpoints("llama")[1]


@pytest.fixture(scope="session")
def zoo_like_dir(tmp_path_factory):
    """A random Llama with a real byte-level BPE tokenizer trained on a few stdlib files."""
    import sysconfig

    from outpace.train.tokenizer import save_tokenizer, train_tokenizer

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    texts = [(stdlib / name).read_text() for name in ("textwrap.py", "string.py", "functools.py", "abc.py")]
    tok = train_tokenizer(texts, vocab_size=400)
    model = make_hf_model("llama", vocab_size=tok.get_vocab_size(), eos_token_id=0)
    path = save_hf_model(model, tmp_path_factory.mktemp("zoo_like"))
    save_tokenizer(tok, path, model_max_length=512)
    return path
