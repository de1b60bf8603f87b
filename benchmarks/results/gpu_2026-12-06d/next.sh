#!/usr/bin/env bash
# For the next session with a device (written 2026-12-06, not yet run): what a token map (--speculative-token-map,
# speculative/hot_vocab.py) saves on the GPU. ARG: heads (benchmarks/scripts/hot_head_speed.py: the draft head alone,
# greedy and sampled, 1 / 8 / 32 rows, over the Qwen3-Next, Llama-3, DeepSeek-V3 and Kimi-K2 heads, with and without
# a map of 32,768 tokens, then tests/speculative/test_hot_vocab.py's GPU tests; about 120 s) or mtp (the whole
# Qwen3-Next-80B-A3B in block FP8 with its MTP layer, step costs by draft count, bench/families.py run_mtp_oracle,
# without and with a random map of 32,768 of its 151,936 tokens: two builds of about 175 s each, an H200 only: the
# model is 80 GB).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
if [ "$1" = heads ]; then
  timeout 300 python3 benchmarks/scripts/hot_head_speed.py --out $OUT/hot_head_speed.json 2>&1 | grep -v Warn
  timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/speculative/test_hot_vocab.py 2>&1 | tail -3
  exit
fi
python3 -c "import torch; torch.save(torch.randperm(151936)[:32768].tolist(), '/tmp/map32768.pt')"
for map in none /tmp/map32768.pt; do
  name=none; [ "$map" != none ] && name=map
  timeout 270 python3 benchmarks/scripts/qwen3next_fp8_mtp_steps.py $OUT/mtp_oracle_$name.json \
    $([ "$map" != none ] && echo --token-map $map) 2>&1 | grep -E "batch|Error"
done
