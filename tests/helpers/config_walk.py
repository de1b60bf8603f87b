"""The families' config-field walks (tests/engine/test_config_fields.py, tests/models/test_gemma.py,
test_deepseek.py, test_qwen3_moe.py): every field of a transformers config class is implemented, irrelevant to
inference, or refused by name. What every such class inherits from transformers' PreTrainedConfig and its
common text-model fields, where they do not change what inference computes, and why."""

COMMON_IRRELEVANT = {
    "transformers_version",
    "_name_or_path",  # provenance
    "model_type",  # the architectures entry names the class
    "output_hidden_states",
    "output_attentions",
    "return_dict",  # what a transformers forward returns
    "use_cache",  # transformers' own KV cache switch
    "is_encoder_decoder",
    "chunk_size_feed_forward",  # not read by these decoder-only classes
    "id2label",
    "label2id",
    "problem_type",  # classification heads
    "initializer_range",  # initialisation
    "attention_dropout",  # training only (dropout is 0 in eval)
    "pad_token_id",
    "bos_token_id",  # the tokenizer's business
}
