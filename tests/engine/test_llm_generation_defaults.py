"""``LLM.generate`` and ``LLM.chat`` without sampling params use the model's generation_config.json sampling
defaults, as vLLM's ``LLM.get_default_sampling_params`` does (outpace/generation_defaults.py); given params are
used as they are, ``generation_config="vllm"`` ignores the file, and a bad value is refused before the model
loads, naming the file and the field."""

from __future__ import annotations

import re

import pytest

from helpers.generation_config_dirs import tinypy_with_generation_config
from outpace import LLM, SamplingParams
from outpace.validation import ConfigError

FILE = {"temperature": 0.0, "max_new_tokens": 3, "top_p": 0.9, "do_sample": False}
PROMPT = [5, 6, 7]


def test_generate_and_chat_without_params_take_the_files_defaults(tmp_path):
    model = tinypy_with_generation_config(tmp_path / "tinypy", FILE)
    llm = LLM(model, device="cpu", num_kv_blocks=64, max_num_seqs=4)
    defaults = SamplingParams(temperature=0.0, top_p=0.9, max_tokens=3)
    assert llm.get_default_sampling_params() == defaults
    out = llm.generate(PROMPT)[0]
    assert out.token_ids == llm.generate(PROMPT, defaults)[0].token_ids and len(out.token_ids) == 3
    given = SamplingParams(temperature=1.0, seed=1, max_tokens=8)  # given params are used as given
    assert len(llm.generate(PROMPT, given)[0].token_ids) == 8
    chat = [{"role": "user", "content": "hi"}]
    assert (
        len(llm.chat(chat)[0].token_ids) <= 3
        and llm.chat(chat)[0].text == llm.chat(chat, defaults)[0].text
    )
    plain = LLM(model, device="cpu", num_kv_blocks=64, generation_config="vllm")
    assert plain.get_default_sampling_params() == SamplingParams()


def test_a_bad_value_is_refused_before_the_model_loads(tmp_path):
    model = tinypy_with_generation_config(tmp_path / "tinypy", {**FILE, "top_p": "0.9"})
    path = re.escape(f"{model}/generation_config.json")
    with pytest.raises(ConfigError, match=f"^{path}: field 'top_p' must be a number, got '0.9'"):
        LLM(model, device="cpu", load_format="dummy")
