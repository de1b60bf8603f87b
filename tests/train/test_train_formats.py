"""``outpace train draft`` for a target outside the zoo, from the user's prompt files, writes EAGLE3 and
DFlash checkpoints in the public formats: exactly the config fields and tensor names (and shapes) that the
other engines' loaders read, and nothing they would trip on; outpace loads them back and serves losslessly.

What the loaders read (cited, not copied):
- EAGLE3, SGLang python/sglang/srt/models/llama_eagle3.py: ``LlamaForCausalLMEagle3`` reads
  ``draft_vocab_size``, ``tie_word_embeddings``, ``vocab_size``; its ``LlamaModel`` reads
  ``target_hidden_size`` (fc over 3 x that), ``hidden_size``, ``num_hidden_layers`` (1: ``midlayer``),
  ``rms_norm_eps``, ``rope_scaling``; the ``midlayer`` (SGLang's llama.py LlamaDecoderLayer) reads
  ``num_attention_heads``, ``num_key_value_heads``, ``head_dim``, ``rope_theta``, ``max_position_embeddings``,
  ``intermediate_size``, ``hidden_act``, with q/k/v over [embedding, hidden] (2 x hidden) and a
  ``hidden_norm``; ``load_weights`` takes ``d2t`` (hot token ids = d2t + arange), skips ``t2d`` and maps every
  other name to ``model.<name>`` (``fc``, ``midlayer.*``, ``norm``) or ``lm_head``. The aux layers come from
  ``eagle_config.eagle_aux_hidden_state_layer_ids``. SpecForge's draft configs (configs/*-eagle3.json)
  carry the same fields with ``architectures: [LlamaForCausalLMEagle3]``, ``model_type: llama``,
  ``torch_dtype``, ``eos_token_id``.
- DFlash, z-lab/dflash dflash/model.py: ``DFlashDraftModel`` (a ``Qwen3PreTrainedModel``) reads
  ``dflash_config.target_layer_ids`` (required), ``block_size``, ``mask_token_id``; ``fc`` over
  len(target_layer_ids) x hidden, ``hidden_norm``, ``norm`` and ``layers.{i}`` with Qwen3's parameter names
  (``self_attn.{q,k,v,o}_proj``, ``self_attn.{q,k}_norm``, ``mlp.{gate,up,down}_proj``, two norms); no
  embedding or head (the target's). SpecForge's DFlash configs add ``num_target_layers`` and ``block_size``.
"""

import json
import sysconfig
from pathlib import Path

import pytest
import torch
import transformers
from safetensors import safe_open

from helpers.hf_models import make_hf_model, save_hf_model
from outpace import LLM, SamplingParams
from outpace.cli import main as cli_main
from outpace.config import SpeculativeConfig

EAGLE3_FIELDS = {  # read by SGLang's llama_eagle3.py / llama.py, as SpecForge writes them
    "architectures",
    "model_type",
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "num_hidden_layers",
    "vocab_size",
    "draft_vocab_size",
    "target_hidden_size",
    "hidden_act",
    "rms_norm_eps",
    "rope_theta",
    "max_position_embeddings",
    "tie_word_embeddings",
    "eagle_config",
}
EAGLE3_OPTIONAL = {"torch_dtype", "eos_token_id", "rope_scaling"}
EAGLE3_TENSORS = {
    "fc.weight",
    "norm.weight",
    "lm_head.weight",
    "d2t",
    "t2d",
    "midlayer.hidden_norm.weight",
    *(
        f"midlayer.{n}.weight"
        for n in (
            "input_layernorm",
            "post_attention_layernorm",
            "self_attn.q_proj",
            "self_attn.k_proj",
            "self_attn.v_proj",
            "self_attn.o_proj",
            "mlp.gate_proj",
            "mlp.up_proj",
            "mlp.down_proj",
        )
    ),
}
DFLASH_FIELDS = {  # Qwen3Config fields z-lab's DFlashDraftModel builds from, plus its dflash_config
    "architectures",
    "model_type",
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "num_hidden_layers",
    "hidden_act",
    "attention_bias",
    "rms_norm_eps",
    "rope_theta",
    "max_position_embeddings",
    "vocab_size",
    "tie_word_embeddings",
    "dflash_config",
    "num_target_layers",
    "block_size",
}
DFLASH_OPTIONAL = {"torch_dtype", "rope_scaling"}


@pytest.fixture(scope="module")
def user_target(tmp_path_factory):
    """A 4-layer Llama outside the zoo (nothing beside it), peaked outputs, a real tokenizer with
    <|mask|> and a chat template."""
    from outpace.train.tokenizer import save_tokenizer, train_tokenizer

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    tok = train_tokenizer(
        [(stdlib / name).read_text() for name in ("textwrap.py", "string.py", "abc.py")],
        vocab_size=400,
    )
    model = make_hf_model(
        "llama",
        vocab_size=tok.get_vocab_size(),
        eos_token_id=0,
        num_hidden_layers=4,
        initializer_range=0.5,
    )
    path = save_hf_model(model, tmp_path_factory.mktemp("user_target") / "target")
    save_tokenizer(tok, path, model_max_length=512)
    return path


@pytest.fixture(scope="module")
def prompt_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("data")
    records = [
        "def add(a, b):\n    return",
        {"prompt": "import os\nclass Config:\n    def"},
        {"text": "for i in range(10):\n    print("},
        {
            "messages": [
                {"role": "user", "content": "write a loop"},
                {"role": "assistant", "content": "ok"},
                {"role": "user", "content": "in python"},
            ]
        },
        {"conversations": [{"from": "human", "value": "sort a list"}]},
    ]
    (d / "prompts.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n")
    (d / "doc.txt").write_text((Path(sysconfig.get_paths()["stdlib"]) / "string.py").read_text())
    return [d / "prompts.jsonl", d / "doc.txt"]


def train_via_cli(method: str, target: Path, out: Path, files, *extra: str) -> dict:
    cli_main(
        [
            "train",
            "draft",
            "--method",
            method,
            "--target",
            str(target),
            "--out",
            str(out),
            "--device",
            "cpu",
            "--toy",
            "--steps",
            "4",
            "--data",
            *map(str, files),
            *extra,
        ]
    )
    return json.loads((out / "training_metrics.json").read_text())


def tensors(path: Path) -> dict[str, torch.Tensor]:
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def assert_serves_losslessly(target: Path, spec: SpeculativeConfig) -> None:
    greedy = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    prompts = [[5, 17, 3, 40], [9, 9, 101, 7, 64, 3]]
    expected = [o.token_ids for o in LLM(str(target)).generate(prompts, greedy)]
    assert [
        o.token_ids for o in LLM(str(target), speculative=spec).generate(prompts, greedy)
    ] == expected


def test_prompt_files_give_every_jsonl_prompt_then_text_windows(user_target, prompt_files):
    from transformers import AutoTokenizer

    from outpace.train.prompts import load_prompt_ids

    tok = AutoTokenizer.from_pretrained(str(user_target))
    prompts = load_prompt_ids(prompt_files, user_target, prompt_len=8, num=9)
    assert len(prompts) == 9 and all(1 <= len(p) <= 8 for p in prompts)
    assert prompts[0] == tok.encode("def add(a, b):\n    return", add_special_tokens=False)[-8:]
    chat = tok.apply_chat_template(
        [
            {"role": "user", "content": "write a loop"},
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": "in python"},
        ],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert prompts[3] == tok.encode(chat, add_special_tokens=False)[-8:]
    assert all(len(p) == 8 for p in prompts[5:])  # windows of the text file
    with pytest.raises(ValueError, match="no prompt found"):
        from outpace.train.prompts import record_ids

        record_ids({"answer": "x"}, tok, "f.jsonl:1")


def test_eagle3_export_is_the_public_format(user_target, prompt_files, tmp_path):
    out = tmp_path / "eagle3"
    metrics = train_via_cli(
        "eagle3",
        user_target,
        out,
        prompt_files,
        "--num-continuations",
        "6",
        "--set",
        "draft_vocab_size=64",
    )
    assert metrics["recipe"]["prompt_files"] == [str(f) for f in prompt_files]
    assert "heldout" not in metrics  # no held-out prompts beside a user's target, none given
    cfg = json.loads((out / "config.json").read_text())
    assert EAGLE3_FIELDS <= set(cfg) <= EAGLE3_FIELDS | EAGLE3_OPTIONAL, set(cfg) ^ EAGLE3_FIELDS
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["model_type"] == "llama"
    assert set(cfg["eagle_config"]) == {"eagle_aux_hidden_state_layer_ids"}
    assert (
        cfg["num_hidden_layers"] == 1
        and cfg["tie_word_embeddings"] is False
        and cfg["draft_vocab_size"] == 64
    )
    t = tensors(out)
    assert set(t) == EAGLE3_TENSORS
    # shapes as SGLang builds them: a Llama decoder layer whose q/k/v read 2 x hidden, fc over 3 x target hidden
    llama = transformers.LlamaConfig(
        **{
            k: cfg[k]
            for k in EAGLE3_FIELDS
            - {"architectures", "eagle_config", "draft_vocab_size", "target_hidden_size"}
        }
    )
    layer = transformers.models.llama.modeling_llama.LlamaDecoderLayer(llama, 0)
    for name, p in layer.state_dict().items():
        shape = list(p.shape)
        if name.split(".")[1] in ("q_proj", "k_proj", "v_proj"):
            shape[1] *= 2
        assert list(t[f"midlayer.{name}"].shape) == shape, name
    h = cfg["hidden_size"]
    assert t["fc.weight"].shape == (h, 3 * cfg["target_hidden_size"]) and t[
        "midlayer.hidden_norm.weight"
    ].shape == (h,)
    assert t["lm_head.weight"].shape == (64, h) and t["norm.weight"].shape == (h,)
    assert t["d2t"].dtype == torch.int64 and t["d2t"].shape == (64,)
    assert t["t2d"].dtype == torch.bool and t["t2d"].shape == (cfg["vocab_size"],)
    hot = t["d2t"] + torch.arange(64)  # SGLang's hot_token_id
    assert torch.equal(hot, t["t2d"].nonzero().flatten())
    assert all(v.dtype == torch.bfloat16 for k, v in t.items() if k not in ("d2t", "t2d"))
    assert_serves_losslessly(user_target, SpeculativeConfig("eagle3", str(out), num_steps=3))


def test_dflash_export_is_the_public_format(user_target, prompt_files, tmp_path):
    out = tmp_path / "dflash"
    metrics = train_via_cli("dflash", user_target, out, prompt_files, "--num-continuations", "6")
    cfg = json.loads((out / "config.json").read_text())
    assert DFLASH_FIELDS <= set(cfg) <= DFLASH_FIELDS | DFLASH_OPTIONAL, set(cfg) ^ DFLASH_FIELDS
    assert cfg["architectures"] == ["DFlashDraftModel"]
    d = cfg["dflash_config"]
    assert set(d) == {"block_size", "mask_token_id", "target_layer_ids"}
    assert (
        d["target_layer_ids"] == metrics["target_layer_ids"]
        and d["block_size"] == cfg["block_size"]
    )
    from transformers import AutoTokenizer

    assert d["mask_token_id"] == AutoTokenizer.from_pretrained(
        str(user_target)
    ).convert_tokens_to_ids("<|mask|>")
    t = tensors(out)
    qwen3 = transformers.Qwen3Config(
        **{
            k: cfg[k]
            for k in DFLASH_FIELDS
            - {"architectures", "dflash_config", "num_target_layers", "block_size"}
        }
    )
    expected = {
        "fc.weight": (cfg["hidden_size"], len(d["target_layer_ids"]) * cfg["hidden_size"]),
        "hidden_norm.weight": (cfg["hidden_size"],),
        "norm.weight": (cfg["hidden_size"],),
    }
    for i in range(
        cfg["num_hidden_layers"]
    ):  # z-lab's layers carry Qwen3's parameter names and shapes
        layer = transformers.models.qwen3.modeling_qwen3.Qwen3DecoderLayer(qwen3, i)
        expected.update({f"layers.{i}.{n}": tuple(p.shape) for n, p in layer.state_dict().items()})
    assert {k: tuple(v.shape) for k, v in t.items()} == expected
    assert_serves_losslessly(
        user_target, SpeculativeConfig("dflash", str(out), num_steps=d["block_size"] - 1)
    )


def test_cli_refuses_unknown_recipe_fields(user_target, tmp_path):
    with pytest.raises(SystemExit, match="Eagle3Recipe"):
        cli_main(
            [
                "train",
                "draft",
                "--method",
                "eagle3",
                "--target",
                str(user_target),
                "--out",
                str(tmp_path),
                "--device",
                "cpu",
                "--toy",
                "--set",
                "no_such_field=1",
            ]
        )


def test_training_metrics_round_curves_only(tmp_path):
    """training_metrics.json keeps a run's figures exact and its curves (lists) to 5 significant digits."""
    from outpace.train.metrics_file import write_metrics

    metrics = {
        "final_loss": 0.123456789,
        "history": {"losses": [2.718281828, 3], "extra": {"top1": [[0.333333333]]}},
        "recipe": {"lr": 0.00123456789, "aux_layer_ids": [2, 4, 6]},
    }
    write_metrics(tmp_path, metrics)
    saved = json.loads((tmp_path / "training_metrics.json").read_text())
    assert saved["final_loss"] == 0.123456789 and saved["recipe"] == metrics["recipe"]
    assert saved["history"] == {"losses": [2.7183, 3], "extra": {"top1": [[0.33333]]}}
