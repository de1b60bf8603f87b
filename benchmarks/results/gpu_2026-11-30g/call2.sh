#!/usr/bin/env bash
# Device call 2 (nvidia-h200-x2), from .snap/ (a git archive of HEAD): the sweeps of the two new launch options
# and the families with the grouped experts' split K (18dfb02, planned splits on by default).
#   GPU 0: benchmarks/scripts/quant_matmul_settings.py (swap_ab, wide fp8 K steps, split: aadbdae); the fused fp8
#          test that failed unnamed in call 1, alone with its traceback; families --quantized fp8 V2-Lite and the
#          Qwen3-Next slice (call 1 / 30f call 4: 455.0, 1200.5 tok/s at batch 1).
#   GPU 1: benchmarks/scripts/moe_fp8_settings.py --study splits (planned against (1, 1)); families bf16 V2-Lite,
#          Qwen3-Next slice, Gemma 4 (30e call 4: 428.6, 1223.2, 282.3 tok/s at batch 1).
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p $OUT/logs
( export CUDA_VISIBLE_DEVICES=0
  timeout 200 python3 benchmarks/scripts/quant_matmul_settings.py --out $OUT/logs/quant_matmul_settings.json \
      > $OUT/logs/qm.log 2>&1; echo "qm rc=$?" >> $OUT/logs/qm.log
  timeout 90 python3 -m pytest -x -q -p no:cacheprovider --tb=long tests/layers/test_fused_projection_fp8.py \
      -k fused_decoder_layers_over_block_fp8 > $OUT/logs/t_fp8.log 2>&1; echo "t_fp8 rc=$?" >> $OUT/logs/t_fp8.log
  timeout $(( 490 - SECONDS )) python3 -m outpace.bench.families --out $OUT/famQ --no-verify --quantized fp8 \
      --compare-with c1famV c4famS --shapes deepseek-v2-lite,qwen3-next-80b-slice > $OUT/logs/famQ.log 2>&1
  echo "famQ rc=$?" >> $OUT/logs/famQ.log
) &
( export CUDA_VISIBLE_DEVICES=1
  timeout 200 python3 benchmarks/scripts/moe_fp8_settings.py --out $OUT/logs/moe > $OUT/logs/moe.log 2>&1
  echo "moe rc=$?" >> $OUT/logs/moe.log
  timeout $(( 490 - SECONDS )) python3 -m outpace.bench.families --out $OUT/famB --no-verify \
      --compare-with c30eA c30eM --shapes deepseek-v2-lite,qwen3-next-80b-slice,gemma-4-26b-a4b \
      > $OUT/logs/famB.log 2>&1; echo "famB rc=$?" >> $OUT/logs/famB.log
) &
wait
for d in famQ famB; do cp $OUT/$d/families.json $OUT/logs/families_$d.json 2>/dev/null; done
tar czf $OUT/logs.tgz -C $OUT logs
echo "== qm"; grep -v "^\s*$" $OUT/logs/qm.log | tail -n 40
echo "== moe"; grep -v "^\s*$" $OUT/logs/moe.log | tail -n 40
echo "== t_fp8"; grep -E "passed|failed|Error|assert|rc=" $OUT/logs/t_fp8.log | tail -n 12
for d in famQ famB; do echo "== $d"; grep -v "%|" $OUT/logs/$d.log | grep -v "^\s*$" | grep -v -i "warn\|legend\|capturing" | tail -n 12; done
