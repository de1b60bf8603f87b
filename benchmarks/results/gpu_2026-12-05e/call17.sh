#!/usr/bin/env bash
# Device call 17 (written for the next session with a device): where the widened DeepSeek's MTP loses its closed
# batch. At batch 1 (call 15, H100) a closed row of 8 requests of 64 tokens took 229 ms more than its steady rate
# accounts for, against 79 ms for plain decoding: about 19 ms more a request (Qwen3.5's MTP: 391 against 504).
# diag_spec_gaps.py decodes one request under torch.profiler for each method and lists every engine step's wall
# time (the prefill step, with the MTP layers' absorb, among them), the host's waits and the GPU's idle gaps.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 400 python3 benchmarks/scripts/diag_spec_gaps.py --family deepseek --methods none mtp \
  --workdir /tmp/e2e_deepseek --out $OUT/gaps_deepseek.json > $OUT/gaps_deepseek.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/gaps_deepseek.log
sed -i -E 's/\r/\n/g' $OUT/*.log
sed -i -E '/(it\/s|s\/it|tensor\/s)\]$/d' $OUT/*.log
tail -n 40 $OUT/gaps_deepseek.log
