"""A checkpoint's config.json is honoured as transformers reads it, or refused with an error that names
the file and the field (issue 42, item 2)."""

import json

import pytest
import transformers

from helpers.hf_models import make_hf_model, paged_prefill_error, save_hf_model
from outpace.model_config import ModelConfig
from outpace.validation import ConfigError


def rewrite_config(path, **changes):
    """Change fields of the checkpoint's config.json; returns transformers' model of the new file."""
    cfg = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**cfg, **changes}))
    return transformers.AutoModelForCausalLM.from_pretrained(path).eval()


# transformers 5 writes rope_parameters; our zoo's configs (and many on the Hub) keep a top-level
# rope_theta beside it. transformers reads the rope_parameters, falling back on rope_theta.
ROPE_LAYOUTS = {
    "linear factor 2": {
        "rope_theta": 10000.0,
        "rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0},
    },
    "theta inside": {
        "rope_theta": 10000.0,
        "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0},
    },
    "theta outside": {"rope_theta": 500000.0, "rope_parameters": {"rope_type": "default"}},
}


@pytest.mark.parametrize("layout", list(ROPE_LAYOUTS))
def test_rope_parameters_beside_rope_theta_match_transformers(layout, tmp_path):
    path = save_hf_model(make_hf_model("llama"), tmp_path)
    hf = rewrite_config(path, **ROPE_LAYOUTS[layout])
    rel = paged_prefill_error(hf, path, hf.config.vocab_size)
    assert rel < 1e-4, f"{layout}: relative error {rel}"


def test_unimplemented_rope_type_in_rope_parameters_is_refused_beside_rope_theta():
    cfg = {**make_hf_model("llama").config.to_dict(), "architectures": ["LlamaForCausalLM"]}
    for key in ("rope_parameters", "rope_scaling"):
        rope = {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}
        with pytest.raises(ConfigError, match="rope_type.*'dynamic'"):
            ModelConfig.from_dict({**cfg, "rope_theta": 10000.0, key: rope})
