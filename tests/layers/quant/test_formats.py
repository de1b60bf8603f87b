"""The formats' math (layers/quant/dequantize.py), the config parsing (scheme.py) and how scales shard."""

import pytest
import torch

from outpace.distributed.sharding import PackedShard, Shard, ShardingError
from outpace.layers.quant import dequantize as dq
from outpace.layers.quant.linear import scale_shard
from outpace.layers.quant.scheme import FP8_BLOCK, FP8_TENSOR, INT4_GROUP, parse_quantization_config
from outpace.validation import ConfigError


def test_int4_nibbles_are_lowest_first_and_stored_plus_8():
    """compressed-tensors pack_to_int32: value i of each eight in bits 4i..4i+3, as q + 8."""
    q = torch.tensor([[-8, -1, 0, 1, 2, 3, 4, 7]], dtype=torch.int8)
    word = sum(
        (int(v) + 8) << (4 * i) for i, v in enumerate(q[0])
    )  # 0xF_C_B_A_9_8_7_0 read high to low
    word = word - (1 << 32) if word >= 1 << 31 else word
    packed = torch.tensor([[word]], dtype=torch.int32)
    assert torch.equal(dq.unpack_int4(packed, 8), q)
    # the test-side packer writes the same word (absmax 7: scale 1, q unchanged)
    q7 = torch.tensor([[-7, -1, 0, 1, 2, 3, 4, 7]], dtype=torch.int8)
    word7 = sum((int(v) + 8) << (4 * i) for i, v in enumerate(q7[0]))
    packed7, scale = dq.quantize_int4_group(q7.float(), 8)
    assert scale.item() == 1.0 and packed7.item() == word7 - (1 << 32)


def test_int4_round_trip_within_half_a_step():
    w = torch.randn(2, 6, 48)
    packed, scale = dq.quantize_int4_group(w, 16)
    assert packed.shape == (2, 6, 6) and scale.shape == (2, 6, 3)
    err = (dq.dequantize_int4_group(packed, scale, 16) - w).abs()
    assert (err <= scale.repeat_interleave(16, -1) / 2 + 1e-6).all()


def test_block_fp8_multiplies_each_block_by_its_scale():
    weight = torch.ones(5, 7).to(dq.FP8_DTYPE)
    scale_inv = torch.tensor(
        [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]
    )  # blocks of 2 x 4: ceil(5/2), ceil(7/4)
    out = dq.dequantize_fp8_block(weight, scale_inv, (2, 4))
    assert out[0, 0] == 1 and out[1, 4] == 2 and out[2, 3] == 3 and out[4, 6] == 6
    w = torch.randn(3, 40, 24)
    fp8, s = dq.quantize_fp8_block(w, (16, 16))
    assert s.shape == (3, 3, 2)
    assert torch.allclose(dq.dequantize_fp8_block(fp8, s, (16, 16)), w, rtol=0.07, atol=1e-3)


def test_per_tensor_fp8_takes_one_scale_or_one_per_expert():
    w = torch.ones(3, 2, 2).to(dq.FP8_DTYPE)
    assert dq.dequantize_fp8_tensor(w, torch.tensor([2.0])).unique().tolist() == [2.0]
    assert dq.dequantize_fp8_tensor(w, torch.tensor([1.0, 2.0, 3.0]))[:, 0, 0].tolist() == [1, 2, 3]


def test_published_configs_parse():
    block = parse_quantization_config(
        {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128],
         "scale_fmt": "ue8m0", "modules_to_not_convert": ["lm_head", "model.layers.0.linear_attn.in_proj_ba"]},
        "config.json",
    )  # fmt: skip
    assert (block.method, block.block, block.scale_fmt) == (FP8_BLOCK, (128, 128), "ue8m0")
    assert block.excludes("model.layers.0.linear_attn.in_proj_ba") and block.excludes("lm_head")
    assert not block.excludes("model.layers.1.linear_attn.in_proj_ba")
    from helpers.quantized_checkpoints import int4_config, modelopt_config

    ignore = ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*"]
    int4 = parse_quantization_config(int4_config(32, ignore), "config.json")
    assert (int4.method, int4.group) == (INT4_GROUP, 32)
    assert int4.excludes("model.layers.3.self_attn.q_a_proj") and not int4.excludes(
        "model.layers.3.mlp.experts.0.up_proj"
    )
    modelopt = parse_quantization_config(
        {"quant_method": "modelopt", **modelopt_config(["lm_head", "backbone.layers.0*"])},
        "config.json",
    )
    assert modelopt.method == FP8_TENSOR and modelopt.excludes("backbone.layers.0.mixer.in_proj")


@pytest.mark.parametrize(
    "field,value",
    [
        ("num_bits", 8),
        ("strategy", "channel"),
        ("symmetric", False),
        ("type", "float"),
        ("actorder", "group"),
        ("zero_point", 0),
    ],
)
def test_int4_options_outpace_lacks_are_refused_by_name(field, value):
    from helpers.quantized_checkpoints import int4_config

    cfg = int4_config(32)
    cfg["config_groups"]["group_0"]["weights"][field] = value
    with pytest.raises(ConfigError, match=field):
        parse_quantization_config(cfg, "config.json")


def test_scales_shard_with_their_blocks_and_a_cut_block_is_refused():
    # column-parallel rows 256..512 of 1024 in 128-row blocks: scale rows 2..4 of 8
    assert scale_shard(Shard(0, 256, 256, 1024), (128, 128), "q_proj", "scale") == Shard(0, 2, 2, 8)
    # the last part may end in a partial block
    assert scale_shard(Shard(1, 128, 72, 200), (128, 128), "o_proj", "scale") == Shard(1, 1, 1, 2)
    assert scale_shard(Shard(1, 64, 64, 128), (1, 8), "down_proj", "weight") == Shard(1, 8, 8, 16)
    with pytest.raises(ShardingError, match="model.layers.0.self_attn.o_proj"):
        scale_shard(Shard(1, 192, 192, 384), (128, 128), "model.layers.0.self_attn.o_proj", "scale")
    packed = PackedShard(0, ((256, 128, 128), (512, 256, 256)))
    assert scale_shard(packed, (128, 128), "in_proj", "scale") == PackedShard(
        0, ((2, 1, 1), (4, 2, 2))
    )


def _modelopt_config_json(**group_changes) -> dict:
    """ModelOpt's config.json form of FP8 with ``group_changes`` ("weights__num_bits": 4) made to its group."""
    from helpers.quantized_checkpoints import modelopt_config_json

    config = modelopt_config_json()
    for path, value in group_changes.items():
        *parents, leaf = path.split("__")
        node = config["config_groups"]["group_0"]
        for parent in parents:
            node = node[parent]
        node[leaf] = value
    return config


def test_modelopt_config_json_with_its_config_groups_parses():
    scheme = parse_quantization_config(_modelopt_config_json(), "config.json")
    assert (scheme.method, scheme.kv_cache_quant_algo, scheme.exclude) == (
        FP8_TENSOR,
        "FP8",
        ("lm_head",),
    )
    older = _modelopt_config_json()  # (older exports write no targets)
    del older["config_groups"]["group_0"]["targets"]
    assert parse_quantization_config(older, "config.json").method == FP8_TENSOR


@pytest.mark.parametrize(
    "change,named",
    [
        ({"weights__num_bits": 4}, "group_0.weights.num_bits"),
        ({"weights__strategy": "channel"}, "group_0.weights.strategy"),
        ({"weights__dynamic": True}, "group_0.weights.dynamic"),
        ({"input_activations__dynamic": True}, "group_0.input_activations.dynamic"),
        ({"input_activations__group_size": 16}, "group_0.input_activations.group_size"),
        ({"targets": ["re:.*experts.*"]}, "group_0.targets"),
        ({"pre_quant_scale": True}, "group_0.pre_quant_scale"),
    ],
)
def test_modelopt_config_groups_that_are_not_per_tensor_fp8_are_refused_by_name(change, named):
    with pytest.raises(
        ConfigError, match=f"config.json: field 'quantization_config.config_groups.{named}'"
    ):
        parse_quantization_config(_modelopt_config_json(**change), "config.json")


@pytest.mark.parametrize("fmt", ["int4", "float"])
def test_a_null_config_group_is_refused_by_name(fmt):
    from helpers.quantized_checkpoints import float_quantized_config, int4_config

    cfg = int4_config(32) if fmt == "int4" else float_quantized_config("channel")
    cfg["config_groups"]["group_0"] = None
    with pytest.raises(
        ConfigError, match="'quantization_config.config_groups.group_0' must be an object"
    ):
        parse_quantization_config(cfg, "config.json")


def test_float_weights_without_a_strategy_are_per_tensor_and_dynamic_weights_are_refused():
    """compressed-tensors QuantizationArgs: no strategy and no group_size is per tensor. Weights quantized at run
    time (``dynamic: true``) are not the stored fp8 weights and scales this format reads."""
    from helpers.quantized_checkpoints import float_quantized_config

    cfg = float_quantized_config("tensor")
    del cfg["config_groups"]["group_0"]["weights"]["strategy"]
    assert parse_quantization_config(cfg, "config.json").method == FP8_TENSOR
    for strategy in ("tensor", "channel"):
        cfg = float_quantized_config(strategy)
        cfg["config_groups"]["group_0"]["weights"]["dynamic"] = True
        with pytest.raises(ConfigError, match="group_0.weights.dynamic' must be False"):
            parse_quantization_config(cfg, "config.json")


def _fp8_block_preset(**activations) -> dict:
    """llm-compressor's FP8_BLOCK scheme (compressed-tensors quant_scheme.py): 128 x 128 weight blocks, activations
    dynamic in groups of 128 columns; ``activations`` changed."""
    from helpers.quantized_checkpoints import float_quantized_config

    config = float_quantized_config("block", (128, 128))
    acts = config["config_groups"]["group_0"]["input_activations"]
    acts.update(strategy="group", group_size=128, dynamic=True)
    acts.update(activations)
    return config


def test_llm_compressor_fp8_block_with_its_grouped_activations_parses():
    scheme = parse_quantization_config(_fp8_block_preset(), "config.json")
    assert (scheme.method, scheme.block) == (FP8_BLOCK, (128, 128))


@pytest.mark.parametrize(
    "activations,named",
    [
        ({"dynamic": False}, "input_activations.dynamic"),
        ({"group_size": None}, "input_activations.group_size"),
        ({"group_size": 0}, "input_activations.group_size"),
        ({"group_size": 64}, "input_activations.group_size' must be 128"),
    ],
)
def test_grouped_activations_that_fp8_block_does_not_write_are_refused_by_name(activations, named):
    with pytest.raises(ConfigError, match=named):
        parse_quantization_config(_fp8_block_preset(**activations), "config.json")
