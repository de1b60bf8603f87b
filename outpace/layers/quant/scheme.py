"""A checkpoint's quantization, read from its config: one frozen ``QuantScheme``, every field checked.

The published formats (the facts each parser checks, with where they come from):
- block FP8, ``config.json`` ``quantization_config`` with ``quant_method: "fp8"`` (DeepSeek-V3/R1, Kimi-K2,
  Qwen3/Qwen3-Next/Qwen3.5-FP8, Step-3.5-Flash-FP8): ``fmt: "e4m3"``, ``activation_scheme: "dynamic"``,
  ``weight_block_size: [128, 128]``, optional ``scale_fmt: "ue8m0"`` (DeepSeek-V3.1: scales are powers of
  two) and ``modules_to_not_convert`` (vLLM fp8.py ``Fp8Config.from_config`` reads these and, as a synonym
  of the last, ``ignored_layers``); without ``weight_block_size``, per-tensor FP8 (AutoFP8's checkpoints,
  Mistral's FP8 releases such as Ministral 3: ``activation_scheme`` "static" or "dynamic", optional
  ``dequantize``), one scale a weight under ModelOpt's names or transformers' (``per_tensor_names``);
- compressed-tensors ``quant_method: "compressed-tensors"``, ``format: "float-quantized"`` (llm-compressor's FP8
  checkpoints, e.g. RedHatAI's ``-FP8-dynamic``: ``weights`` of ``num_bits: 8, type: "float"`` per tensor, per
  output channel or in ``block_structure`` blocks, ``weight_scale`` beside each weight: ``_fp8_group``), or
  ``format: "pack-quantized"`` (Kimi-K2-Thinking):
  ``config_groups`` whose ``weights`` are ``num_bits: 4, type: "int", symmetric: true, strategy: "group",
  group_size: 32`` with no input activations (W4A16), and an ``ignore`` list whose ``re:`` entries are
  regular expressions matched from the start of the module name, the others exact names
  (compressed-tensors utils/match.py ``match_name``; vLLM compressed_tensors.py reads the same fields);
- ModelOpt FP8 (Nemotron-H FP8): ``hf_quant_config.json`` ``{"quantization": {"quant_algo": "FP8",
  "kv_cache_quant_algo": ..., "exclude_modules": [...]}}``, or the same in ``config.json`` as
  ``quant_method: "modelopt"`` with ``quant_algo``, ``ignore``, ``kv_cache_scheme`` and the ``config_groups`` that
  spell FP8 out (vLLM modelopt.py ``ModelOptQuantConfigBase.from_config`` reads both forms; ``exclude_modules``
  are fnmatch wildcards).

Anything else (another method, format, bit width, strategy, an option this module does not name) is refused
by name: a ``ConfigError`` naming the file and the field.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import re
from dataclasses import dataclass
from pathlib import Path

from outpace.validation import ConfigError, ConfigFields, is_int, read_json_object

# a checkpoint's formats: how a quantized weight is stored
FP8_BLOCK = "fp8_block"  # fp8 + a scale per block (weight_scale_inv, or weight_scale)
FP8_TENSOR = "fp8_tensor"  # fp8 + one scale (ModelOpt, AutoFP8, Mistral's, compressed-tensors)
FP8_CHANNEL = "fp8_channel"  # fp8 + one scale per output row (compressed-tensors)
INT4_GROUP = "int4_group"  # weight_packed int32 + weight_scale per group (compressed-tensors)

MODELOPT_CONFIG_FILE = "hf_quant_config.json"

# per-tensor FP8's (weight scale, activation scale) tensor names: ModelOpt's, which AutoFP8's ``quant_method: fp8``
# checkpoints share (vLLM Fp8LinearMethod reads weight_scale and input_scale), and transformers' FP8Linear without
# blocks (integrations/finegrained_fp8.py: a scalar weight_scale_inv, which multiplies, and activation_scale),
# which Mistral's FP8 releases (Ministral 3) are read by
FP8_TENSOR_NAMES = ("weight_scale", "input_scale")
FP8_TENSOR_NAMES_TRANSFORMERS = ("weight_scale_inv", "activation_scale")


@dataclass(frozen=True)
class QuantScheme:
    """How a checkpoint's quantized modules are stored. Which modules are quantized is read per module from
    the checkpoint's tensor names (layers/quant/loading.py), cross-checked with ``excludes``."""

    method: str  # FP8_BLOCK, FP8_TENSOR, FP8_CHANNEL or INT4_GROUP
    source: str  # the file the scheme was read from (errors name it)
    block: tuple[int, int] | None = None  # FP8_BLOCK: (rows, columns) of a scale's block
    group: int | None = None  # INT4_GROUP: columns per scale
    scale_fmt: str | None = None  # FP8_BLOCK: "ue8m0" when the scales are powers of two
    exclude: tuple[str, ...] = ()  # the config's list of unquantized modules
    exclude_field: str = ""  # its field name, for errors
    exclude_match: str = (
        "name"  # "name" (dotted parts), "regex" (compressed-tensors), "wildcard" (ModelOpt)
    )
    kv_cache_quant_algo: str | None = None  # ModelOpt's, for the FP8 KV cache (not this module's)
    # FP8 formats: the names of a module's weight scale and activation scale; None: the format's own
    # (layers/quant/linear.py; per-tensor FP8 reads them from the checkpoint: ``per_tensor_names``)
    tensor_names: tuple[str, str] | None = None
    producer: str = ""  # who wrote the format, where several do: for the start-up log

    @property
    def description(self) -> str:
        """The format in words, for the start-up log."""
        if self.method == FP8_BLOCK:
            scales = ", ue8m0 scales" if self.scale_fmt else ""
            return f"block FP8 e4m3 ({self.block[0]}x{self.block[1]} blocks{scales})"
        if self.method == FP8_TENSOR:
            return f"per-tensor FP8 e4m3 ({self.producer})"
        if self.method == FP8_CHANNEL:
            return f"per-channel FP8 e4m3 ({self.producer})"
        return f"INT4 weights in groups of {self.group} (compressed-tensors pack-quantized)"

    def excludes(self, module: str) -> bool:
        """Whether the config's list keeps ``module`` (its checkpoint name) unquantized."""
        return any(_matches(module, entry, self.exclude_match) for entry in self.exclude)

    def unmatched_excludes(self, modules: set[str]) -> tuple[str, ...]:
        """The module names of the config's list that name none of ``modules`` (dotted names, their ancestors
        included): a name and a module match where one ends with the other at a dot, since a list names modules
        as the quantizer's model class wrapped them (``model.`` or not, ``model.language_model.``), not always as
        the checkpoint or outpace does. Patterns are not checked (``_is_pattern``)."""
        suffixes = {tail for module in modules for tail in _dotted_tails(module)}
        return tuple(
            entry
            for entry in self.exclude
            if not _is_pattern(entry, self.exclude_match)
            and entry not in suffixes
            and not any(tail in modules for tail in _dotted_tails(entry))
        )


def _dotted_tails(name: str) -> list[str]:
    """``a.b.c`` -> ``a.b.c``, ``b.c``, ``c``."""
    parts = name.split(".")
    return [".".join(parts[i:]) for i in range(len(parts))]


def _is_pattern(entry: str, style: str) -> bool:
    """Whether a list entry is a pattern rather than a module's name: compressed-tensors' ``re:`` expressions and
    class names (utils/match.py ``match_name``, ``_match_class``: a dotless CamelCase entry), ModelOpt's fnmatch
    wildcards. A pattern may match nothing on purpose: published lists carry one for each of several layouts
    (llm-compressor examples/quantization_w8a8_fp8/qwen3_5_moe.py ignores both ``re:visual.*`` and
    ``re:model.visual.*``, and MoE routers' ``re:.*mlp.gate$`` travels to dense models' recipes)."""
    if style == "regex":
        return entry.startswith("re:") or ("." not in entry and entry[:1].isupper())
    return style == "wildcard" and any(c in entry for c in "*?[")


def _matches(module: str, entry: str, style: str) -> bool:
    if style == "regex":  # compressed-tensors match_name: "re:" -> re.match, else the exact name
        if entry.startswith("re:"):
            return re.match(entry[3:], module) is not None
        return entry == module
    if style == "wildcard":  # ModelOpt exclude_modules: fnmatch patterns (vLLM is_layer_excluded)
        return fnmatch.fnmatchcase(module, entry) or entry == module
    # modules_to_not_convert: a module name or a dotted part of one ("lm_head", "model.layers.0.mlp.gate")
    return f".{entry}." in f".{module}."


def read_quant_scheme(
    model_dir: str | Path, quantization_config: dict | None, source: str
) -> QuantScheme | None:
    """The scheme of a checkpoint: its ``config.json`` ``quantization_config`` (``source`` names the file),
    else its ``hf_quant_config.json`` (ModelOpt), else None (unquantized). config.json wins when both exist,
    as vLLM's get_quant_config reads the extra file only when the config has no quantization_config."""
    if quantization_config is not None:
        return parse_quantization_config(quantization_config, source)
    extra = Path(model_dir) / MODELOPT_CONFIG_FILE
    if extra.is_file():
        return _modelopt_file(ConfigFields(read_json_object(extra), str(extra)))
    return None


def parse_quantization_config(cfg, source: str) -> QuantScheme:
    """config.json's ``quantization_config`` -> its scheme, or ConfigError naming the field."""
    if not isinstance(cfg, dict):
        raise ConfigError(f"{source}: field 'quantization_config' must be an object, got {cfg!r}")
    fields = ConfigFields(cfg, source, "quantization_config.")
    method = fields.string("quant_method")
    parsers = {
        "fp8": _fp8,
        "compressed-tensors": _compressed_tensors,
        "modelopt": _modelopt_inline,
    }
    if method not in parsers:
        raise fields.fail(
            "quant_method", method, f"one of {', '.join(parsers)} (others are not implemented)"
        )
    try:
        return parsers[method](fields)
    except ConfigError as e:  # which format's rules the field broke
        raise ConfigError(f"{e} (for quantization_config.quant_method={method!r})") from None


def _refuse_unknown(fields: ConfigFields, known: set[str]) -> None:
    for name in fields.data:
        if name not in known:
            raise ConfigError(
                f"{fields.source}: field {fields.prefix + name!r} is not implemented "
                f"(known fields: {', '.join(sorted(known))})"
            )


def _require_value(fields: ConfigFields, name: str, allowed: tuple, default=None) -> None:
    """Field ``name`` absent (when ``default`` is in ``allowed``) or one of ``allowed``."""
    value = fields.get(name, default)
    if value not in allowed:
        raise fields.fail(
            name, value, " or ".join(repr(a) for a in allowed) + " (others are not implemented)"
        )


def _fp8(fields: ConfigFields) -> QuantScheme:
    """``quant_method: fp8``: block FP8 with ``weight_block_size`` (DeepSeek-V3 and the others), per-tensor
    without it (AutoFP8, Mistral's releases: vLLM Fp8Config's other mode, transformers' FP8Linear without
    blocks)."""
    known = {"quant_method", "fmt", "activation_scheme", "weight_block_size", "scale_fmt"}
    # dequantize: whether transformers turns the weights into bf16 at load: either way the same products
    known |= {"modules_to_not_convert", "ignored_layers", "dequantize"}
    _refuse_unknown(fields, known)
    _require_value(fields, "fmt", (None, "e4m3"))
    _require_value(fields, "dequantize", (False, True), False)
    exclude, field = _exclude_list(fields, ("modules_to_not_convert", "ignored_layers"))
    block = fields.get("weight_block_size")
    if block is None:
        # the weights as stored, times their one scale; the products weight-only, as ModelOpt's: activations
        # stay high precision, a "static" checkpoint's activation scales loaded and not applied
        _require_value(fields, "activation_scheme", ("dynamic", "static"), "dynamic")
        _require_value(fields, "scale_fmt", (None,))
        return QuantScheme(
            FP8_TENSOR, fields.source, exclude=exclude, exclude_field=field, exclude_match="name",
            producer="quant_method fp8",
        )  # fmt: skip
    # "dynamic": activations quantized per token in groups of 128 at run time (DeepSeek-V3 inference/kernel.py
    # act_quant); "static" (per-tensor input scales) is not implemented for blocks
    _require_value(fields, "activation_scheme", ("dynamic",))
    _require_value(fields, "scale_fmt", (None, "ue8m0"))
    if not (
        isinstance(block, list)
        and len(block) == 2
        and all(is_int(b) and b > 0 for b in block)  # (a bool is an int to Python)
    ):
        raise fields.fail(
            "weight_block_size",
            block,
            "two positive integers [rows, columns], or null (per tensor)",
        )
    return QuantScheme(
        FP8_BLOCK, fields.source, block=(block[0], block[1]), scale_fmt=fields.get("scale_fmt"),
        exclude=exclude, exclude_field=field, exclude_match="name",
    )  # fmt: skip


def per_tensor_names(scheme: QuantScheme, tensor_names: set[str]) -> QuantScheme:
    """A per-tensor FP8 scheme with the scale names its checkpoint (``tensor_names``) uses: transformers' where
    a ``*.weight_scale_inv`` is stored, else ModelOpt's and AutoFP8's. Any other scheme as it is."""
    if scheme.method != FP8_TENSOR or scheme.tensor_names is not None:
        return scheme
    stored = any(n.endswith("." + FP8_TENSOR_NAMES_TRANSFORMERS[0]) for n in tensor_names)
    names = FP8_TENSOR_NAMES_TRANSFORMERS if stored else FP8_TENSOR_NAMES
    return dataclasses.replace(scheme, tensor_names=names)


def _exclude_list(fields: ConfigFields, names: tuple[str, ...]) -> tuple[tuple[str, ...], str]:
    """The one of ``names`` (synonyms) the config gives (a list of strings), with its field name for errors;
    two that differ are refused (which one a reader honours differs: vLLM's fp8.py reads ``ignored_layers``
    first, transformers ``modules_to_not_convert``). ``re:`` entries (compressed-tensors' regular
    expressions) must compile."""
    given = [(name, entries) for name in names if (entries := fields.strings(name))]
    if len({tuple(entries) for _, entries in given}) > 1:
        raise ConfigError(
            f"{fields.source}: fields "
            + " and ".join(repr(fields.prefix + name) for name, _ in given)
            + " both list unquantized modules, differently: give one"
        )
    if not given:
        return (), ""
    name, entries = given[0]
    for entry in entries:
        if entry.startswith("re:"):
            try:
                re.compile(entry[3:])
            except re.error as e:
                raise fields.fail(
                    name, entry, f"a list of module names or re: patterns ({e})"
                ) from None
    return tuple(entries), fields.source + ": " + fields.prefix + name


def _compressed_tensors(fields: ConfigFields) -> QuantScheme:
    known = {
        "quant_method",
        "format",
        "config_groups",
        "ignore",
        "kv_cache_scheme",
        "quantization_status",
    }
    known |= {"global_compression_ratio", "version", "sparsity_config", "transform_config"}
    _refuse_unknown(fields, known)
    _require_value(fields, "format", ("pack-quantized", "float-quantized"))
    _require_value(fields, "quantization_status", ("compressed",), "compressed")
    kv_algo = _fp8_kv_cache_scheme(fields)
    for name in (
        "sparsity_config",
        "transform_config",
    ):  # informational when null
        if fields.get(name):
            raise fields.fail(name, fields.get(name), "null (not implemented)")
    groups = _config_groups(fields)
    exclude, field = _exclude_list(fields, ("ignore",))
    if fields.get("format") == "float-quantized":
        layouts = {_fp8_group(group) for group in groups}
        if len(layouts) != 1:
            raise fields.fail(
                "config_groups", fields.get("config_groups"), "groups of one strategy and block"
            )
        method, block = layouts.pop()
        # (compressed-tensors names the scales as ModelOpt does, whatever the strategy)
        return QuantScheme(
            method, fields.source, block=block, exclude=exclude, exclude_field=field,
            exclude_match="regex", tensor_names=FP8_TENSOR_NAMES, producer="compressed-tensors",
            kv_cache_quant_algo=kv_algo,
        )  # fmt: skip
    group_sizes = {_int4_group(group) for group in groups}
    if len(group_sizes) != 1:
        raise fields.fail("config_groups", fields.get("config_groups"), "groups of one group_size")
    return QuantScheme(
        INT4_GROUP, fields.source, group=group_sizes.pop(), exclude=exclude, exclude_field=field,
        exclude_match="regex", kv_cache_quant_algo=kv_algo,
    )  # fmt: skip


def _config_groups(fields: ConfigFields) -> list[ConfigFields]:
    """``config_groups``: an object of one or more groups, each an object (errors name the group)."""
    groups = fields.mapping("config_groups")
    if groups is None or not groups.data:
        raise fields.fail(
            "config_groups", fields.get("config_groups"), "an object of one or more groups"
        )
    for name, group in groups.data.items():
        if not isinstance(group, dict):
            raise groups.fail(name, group, "an object (a config group)")
    return [groups.mapping(name) for name in groups.data]


# compressed-tensors' float strategies (quantization/quant_args.py QuantizationStrategy) -> outpace's format
_FP8_STRATEGIES = {"tensor": FP8_TENSOR, "channel": FP8_CHANNEL, "block": FP8_BLOCK}


def _fp8_group(group: ConfigFields) -> tuple[str, tuple[int, int] | None]:
    """One float-quantized config group (llm-compressor's FP8, FP8_DYNAMIC and FP8_BLOCK schemes): Linear
    targets, 8-bit float symmetric weights per tensor, per output channel or in blocks -> (format, block).
    Activations may be quantized per token or per tensor, dynamically or with static scales, or beside block
    weights dynamically in groups of columns (FP8_BLOCK: groups of 128, as DeepSeek-V3's act_quant): the products
    here are weight-only (activations stay high precision; a static ``input_scale`` is loaded, not applied), or
    block FP8's (fp8_linear_kernel.py)."""
    _refuse_unknown(
        group, {"targets", "weights", "input_activations", "output_activations", "format"}
    )
    _require_value(group, "format", (None, "float-quantized"))
    if group.strings("targets") != ["Linear"]:
        raise group.fail("targets", group.get("targets"), '["Linear"] (others are not implemented)')
    if group.get("output_activations") is not None:
        raise group.fail("output_activations", group.get("output_activations"), "null")
    weights = _float8_args(group, "weights", ("tensor", "channel", "block"))
    # weights quantized at run time (vLLM compressed_tensors.py _is_fp8_w8a8 takes static weights only): not
    # the stored fp8 weights and scales this format reads
    _require_value(weights, "dynamic", (False,), False)
    # (absent: per tensor, QuantizationArgs' default without a group_size)
    strategy = weights.get("strategy") or "tensor"
    activations = None
    if group.get("input_activations") is not None:
        grouped = ("group",) if strategy == "block" else ()
        activations = _float8_args(group, "input_activations", ("token", "tensor", *grouped))
    if strategy != "block":
        _require_value(weights, "block_structure", (None,))
        return _FP8_STRATEGIES[strategy], None
    block = weights.get("block_structure")
    if not (
        isinstance(block, list) and len(block) == 2 and all(is_int(b) and b > 0 for b in block)
    ):
        raise weights.fail("block_structure", block, "two positive integers [rows, columns]")
    if activations is not None and activations.get("strategy") == "group":
        # FP8_BLOCK's: dynamic groups as wide as a weight block (DeepSeek-V3's act_quant beside its 128 x 128
        # blocks); static groups no published scheme writes
        _require_value(activations, "dynamic", (True,))
        _require_value(activations, "group_size", (block[1],))
    return FP8_BLOCK, (block[0], block[1])


def _float8_args(group: ConfigFields, name: str, strategies: tuple[str, ...]) -> ConfigFields:
    """``group[name]``: 8-bit float, symmetric, one of ``strategies`` (strategy "group" with its group_size), no
    reordering."""
    args = group.mapping(name)
    if args is None:
        raise group.fail(name, group.get(name), "an object")
    known = {"num_bits", "type", "symmetric", "strategy", "group_size", "dynamic", "actorder"}
    known |= {"block_structure", "observer", "observer_kwargs", "scale_dtype", "zp_dtype"}
    _refuse_unknown(args, known)
    _require_value(args, "num_bits", (8,))
    _require_value(args, "type", ("float",))
    # (QuantizationArgs' defaults where a field is absent: symmetric, per tensor)
    _require_value(args, "symmetric", (True,), True)
    _require_value(args, "strategy", strategies, "tensor")
    _require_value(args, "dynamic", (False, True), False)
    if args.get("strategy") == "group":
        args.integer("group_size")
    else:
        _require_value(args, "group_size", (None,))
    for field in ("actorder", "scale_dtype", "zp_dtype"):  # observer*: calibration only
        _require_value(args, field, (None,))
    return args


def _int4_group(group: ConfigFields) -> int:
    """One config group: Linear targets, INT4 symmetric group weights, no activation quantization."""
    _refuse_unknown(
        group, {"targets", "weights", "input_activations", "output_activations", "format"}
    )
    _require_value(group, "format", (None, "pack-quantized"))
    if group.strings("targets") != ["Linear"]:
        raise group.fail("targets", group.get("targets"), '["Linear"] (others are not implemented)')
    for name in (
        "input_activations",
        "output_activations",
    ):  # W4A16: activations stay high precision
        if group.get(name) is not None:
            raise group.fail(
                name, group.get(name), "null (activation quantization is not implemented)"
            )
    weights = group.mapping("weights")
    if weights is None:
        raise group.fail("weights", None, "an object")
    known = {"num_bits", "type", "symmetric", "strategy", "group_size", "dynamic", "actorder"}
    known |= {"block_structure", "observer", "observer_kwargs", "scale_dtype", "zp_dtype"}
    _refuse_unknown(weights, known)
    _require_value(weights, "num_bits", (4,))
    _require_value(weights, "type", ("int",))
    _require_value(weights, "symmetric", (True,))  # no zero point
    _require_value(weights, "strategy", ("group",))
    _require_value(weights, "dynamic", (False,), False)
    for name in (
        "actorder",
        "block_structure",
        "scale_dtype",
        "zp_dtype",
    ):  # observer*: calibration only
        _require_value(weights, name, (None,))
    group_size = weights.integer("group_size")
    if group_size % 8:
        raise weights.fail(
            "group_size", group_size, "a multiple of 8 (eight 4-bit values per int32)"
        )
    return group_size


def _modelopt_file(fields: ConfigFields) -> QuantScheme:
    """hf_quant_config.json: {"producer": {...}, "quantization": {"quant_algo", "kv_cache_quant_algo",
    "exclude_modules"}}."""
    _refuse_unknown(fields, {"producer", "quantization"})
    quantization = fields.mapping("quantization")
    if quantization is None:
        raise fields.fail("quantization", None, "an object")
    return _modelopt(quantization, "exclude_modules", quantization.get("kv_cache_quant_algo"))


def _modelopt_inline(fields: ConfigFields) -> QuantScheme:
    """config.json's ModelOpt form: the file's ``quantization`` object nested, or flat with ``ignore``,
    ``kv_cache_scheme`` and the ``config_groups`` that spell ``quant_algo`` out (vLLM
    ModelOptQuantConfigBase.from_config reads the first three; ModelOpt's export writes all four:
    modelopt/torch/export/convert_hf_config.py ``convert_hf_quant_config_format``)."""
    nested = fields.mapping("quantization")
    if nested is not None:
        _refuse_unknown(fields, {"quant_method", "quantization", "producer"})
        return _modelopt(nested, "exclude_modules", nested.get("kv_cache_quant_algo"))
    known = {"quant_method", "quant_algo", "ignore", "kv_cache_scheme", "producer", "config_groups"}
    _refuse_unknown(fields, known)
    scheme = _modelopt(fields, "ignore", _fp8_kv_cache_scheme(fields), known_checked=True)
    if fields.get("config_groups") is not None:
        for group in _config_groups(fields):
            _modelopt_fp8_group(group)
    return scheme


def _modelopt_fp8_group(group: ConfigFields) -> None:
    """A config group ModelOpt writes beside ``quant_algo: FP8`` (``convert_hf_quant_config_format``): Linear
    targets (absent in older exports), 8-bit float weights per tensor with stored scales, static 8-bit float
    input activations per tensor (or none). Any other group contradicts the per-tensor FP8 this scheme reads, and
    is refused by name."""
    _refuse_unknown(group, {"targets", "weights", "input_activations", "output_activations"})
    if group.get("targets") is not None and group.strings("targets") != ["Linear"]:
        raise group.fail(
            "targets", group.get("targets"), '["Linear"] or absent (others are not implemented)'
        )
    if group.get("output_activations") is not None:
        raise group.fail("output_activations", group.get("output_activations"), "null")
    for name in ("weights", "input_activations"):
        if name == "weights" or group.get(name) is not None:
            args = _float8_args(group, name, ("tensor",))
            _require_value(args, "dynamic", (False,), False)


def _fp8_kv_cache_scheme(fields: ConfigFields) -> str | None:
    """``kv_cache_scheme`` (compressed-tensors' QuantizationArgs, which ModelOpt's config.json form writes too):
    null, or 8-bit float per tensor with static scales (``k_scale`` / ``v_scale`` in the checkpoint, which
    ``--kv-cache-dtype fp8`` uses: cache/kv_scales.py) -> "FP8" or None."""
    if fields.get("kv_cache_scheme") is None:
        return None
    kv = _float8_args(fields, "kv_cache_scheme", ("tensor",))
    _require_value(kv, "dynamic", (False,), False)
    return "FP8"


def _modelopt(
    fields: ConfigFields, exclude_name: str, kv_algo, known_checked: bool = False
) -> QuantScheme:
    if not known_checked:
        _refuse_unknown(fields, {"quant_algo", "kv_cache_quant_algo", exclude_name, "group_size"})
    # FP8: per-tensor weight_scale and static per-tensor input_scale (vLLM ModelOptFp8LinearMethod); the other
    # algorithms vLLM lists (FP8_PER_CHANNEL_PER_TOKEN, FP8_PB_WO, NVFP4, ...) are not implemented
    _require_value(fields, "quant_algo", ("FP8",))
    if fields.get("group_size") is not None:
        raise fields.fail(
            "group_size", fields.get("group_size"), "absent for FP8 (not implemented)"
        )
    if kv_algo not in (None, "FP8"):
        raise fields.fail(
            "kv_cache_quant_algo", kv_algo, '"FP8" or null (others are not implemented)'
        )
    exclude, field = _exclude_list(fields, (exclude_name,))
    return QuantScheme(
        FP8_TENSOR, fields.source, exclude=exclude, exclude_field=field, exclude_match="wildcard",
        kv_cache_quant_algo=kv_algo, producer="ModelOpt",
    )  # fmt: skip
