#!/usr/bin/env bash
# Device call 20 of gpu_2026-12-02 (nvidia-h200), from .snap/ (a git archive of the commit holding this script):
# narrow pending windows (a drafting step whose requests hold no rows from held steps runs its MTP / EAGLE3
# forward over the rows a verify leaves, 4 for the widened Qwen3.5's MTP, not 12): the window kernel and the
# held / narrow / whole-window steps as CUDA graph replays (lossless in fp32); the widened Qwen3.5's MTP row at
# batch 1 (call 19: 1.98x); the Llama-3.1-8B shape's decode against the floor with call 19's SwiGLU tiles
# (gpu_2026-12-01d call 4: 85.2% at batch 1); the Gemma-3-12B and Qwen3.5 shapes' rows in the time left.
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT/logs
timeout 150 python3 -m pytest -q -p no:cacheprovider --tb=short -rf tests/speculative/test_pending_window.py \
  tests/speculative/test_zero_draft_hold.py -k "gpu or window" > $OUT/logs/pytest.log 2>&1
echo "rc=$?" >> $OUT/logs/pytest.log
timeout 170 python3 -m outpace bench e2e --family qwen35 --batch-sizes 1 --methods none mtp \
  --out /tmp/out_q --workdir /tmp/e2e_q > $OUT/logs/e2e_qwen35.log 2>&1
echo "rc=$?" >> $OUT/logs/e2e_qwen35.log
cp /tmp/out_q/*.json $OUT/logs/ 2>/dev/null
rm -rf /tmp/e2e_q
timeout 100 python3 -c "
import tempfile
from pathlib import Path
import torch
from outpace.bench.gpu import build_8b, copy_bandwidth, kv_bytes_per_token, time_decode, weight_bytes_read
bandwidth = copy_bandwidth()
with tempfile.TemporaryDirectory() as tmp:
    llm = build_8b(Path(tmp) / 'target')
    weights = weight_bytes_read(llm.engine.model)
    kv_token = kv_bytes_per_token(llm.engine.model_config, torch.bfloat16)
    for batch in (1, 8):
        ms = time_decode(llm, batch, 512)['step_ms']
        floor_ms = (weights + batch * 512 * kv_token) / bandwidth * 1e3
        print(f'llama-3.1-8b batch {batch}: {batch * 1e3 / ms:.1f} tokens/s, step {ms:.3f} ms, '
              f'{floor_ms / ms:.1%} of the floor ({bandwidth / 1e12:.2f} TB/s copy)', flush=True)
" > $OUT/logs/llama.log 2>&1
echo "rc=$?" >> $OUT/logs/llama.log
left=$((560 - SECONDS))
[ $left -gt 90 ] && timeout $left python3 -m outpace.bench.families --out $OUT/fam --no-verify \
  --time-limit $((left - 10)) --shapes gemma-3-12b,qwen3.5 > $OUT/logs/fam.log 2>&1
echo "rc=$?" >> $OUT/logs/fam.log
sed -i -E 's/\r/\n/g' $OUT/logs/*.log
sed -i -E '/it\/s|s\/it|tensor\/s/d' $OUT/logs/*.log
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $OUT/logs
tar xzf $OUT/logs.tgz -O logs/pytest.log | grep -E "passed|failed|FAILED|rc=" | tail -n 8
tar xzf $OUT/logs.tgz -O logs/e2e_qwen35.log | grep -E -A5 "^method|rc=" | tail -n 7
tar xzf $OUT/logs.tgz -O logs/llama.log | tail -n 3
tar xzf $OUT/logs.tgz -O logs/fam.log | tail -n 12
