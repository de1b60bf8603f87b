#!/usr/bin/env bash
# Device call 4 of gpu_2026-12-01d (nvidia-h200), from .snap/ (a git archive of 23bd8b7): the session's last call,
# after Gemma 4's layers hand the next layer its input norm's rows and Step-3.5's layers run as one fused
# residual stack (on top of call 3's code).
#   GPU tests: the MoE families' captured decode against eager and the CPU (Step-3.5, Nemotron-H, Gemma 4, the
#   fused residual stack forced onto fp32 rows: Step-3.5 new), Gemma's fused layers and graphs, the sandwich
#   norms' kernels, Step-3.5's fused layers; bench families Nemotron-H-8B, Gemma 4 26B-A4B, the Step-3.5 slice;
#   then, if time is left, the Llama-3.1-8B shape's decode at context 512, batch 1 and 8, against the floor
#   (bench gpu's part b rows).
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT/logs
T="-v -p no:cacheprovider --tb=short -rf"
timeout 200 python3 -m pytest $T tests/gpu/test_gpu_moe_families.py > $OUT/logs/t_moe.log 2>&1
echo "rc=$?" >> $OUT/logs/t_moe.log
timeout 80 python3 -m pytest $T tests/layers/test_gemma_fused.py -k "cuda_graphs or gemma4" \
  tests/layers/test_sandwich_norms.py tests/models/test_step3p5_fused.py > $OUT/logs/t_fused.log 2>&1
echo "rc=$?" >> $OUT/logs/t_fused.log
timeout $(( 500 - SECONDS )) python3 -m outpace.bench.families --out $OUT/fam --no-verify \
  --time-limit $(( 490 - SECONDS )) --shapes nemotron-h-8b,step-3.5-flash-slice,gemma-4-26b-a4b > $OUT/logs/fam.log 2>&1
echo "rc=$?" >> $OUT/logs/fam.log
timeout $(( 555 - SECONDS )) python3 -c "
# bench gpu's part b (outpace/bench/gpu.py llama_8b_parts) at context 512, batches 1 and 8 only
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
tar czf $OUT/logs.tgz -C $OUT logs
echo "== t_moe"; grep -E "FAILED|ERROR| failed| passed|rc=" $OUT/logs/t_moe.log | tail -n 8
echo "== t_fused"; grep -E "FAILED|ERROR| failed| passed|rc=" $OUT/logs/t_fused.log | tail -n 8
echo "== fam"; grep -v "%|" $OUT/logs/fam.log | grep -E "^[a-z0-9.-]+ +[0-9]|kernels|left|rc=" | tail -n 14
echo "== llama"; grep -E "llama|rc=|Error" $OUT/logs/llama.log | tail -n 4
