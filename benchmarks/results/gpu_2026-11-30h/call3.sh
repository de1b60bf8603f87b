#!/usr/bin/env bash
# Device call 3 (nvidia-h200-x2), from .snap/ (a git archive of HEAD): the per-head kernel's partial rotary and
# the quantized q/k/v path (Step-3.5's full-attention layers fused; Step-3.5-Flash-FP8's q/k/v through the
# quantized product and the per-head kernel), the symmetric all-reduce's copy folded into its kernel.
#   GPU 0: the fused projection GPU tests (bf16, fp8, Step's fused layers); routing_timings.py at Qwen3-Next's
#          and Step-3.5's routings (the route kernel's warps); families --quantized fp8 Step-3.5 slice
#          (30g call 3: 691.7 tok/s at batch 1).
#   GPU 1: families bf16 Step-3.5 slice (30g call 1: 633.3 tok/s, 130 kernels a step).
#   Then both: the symmetric all-reduce GPU test; bench multi qwen3next80b and step35flash, plain decode
#   (call 1: 248.1 and 147.9 tok/s at batch 1).
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p $OUT/logs
T="-v -p no:cacheprovider --tb=short -rf"
( export CUDA_VISIBLE_DEVICES=0
  timeout 100 python3 -m pytest $T tests/layers/test_fused_projection.py tests/layers/test_fused_projection_fp8.py \
      tests/models/test_step3p5_fused.py > $OUT/logs/t_gpu0.log 2>&1; echo "t_gpu0 rc=$?" >> $OUT/logs/t_gpu0.log
  timeout 50 python3 benchmarks/scripts/routing_timings.py $OUT/logs/routing qwen3-next-80b step-3.5-flash \
      > $OUT/logs/routing.log 2>&1; echo "routing rc=$?" >> $OUT/logs/routing.log
  timeout $(( 250 - SECONDS )) python3 -m outpace.bench.families --out $OUT/famSq --no-verify --quantized fp8 \
      --compare-with c3famQ --shapes step-3.5-flash-slice > $OUT/logs/famSq.log 2>&1; echo "famSq rc=$?" >> $OUT/logs/famSq.log
) &
( export CUDA_VISIBLE_DEVICES=1
  timeout 200 python3 -m outpace.bench.families --out $OUT/famSb --no-verify --compare-with c1famSb \
      --shapes step-3.5-flash-slice > $OUT/logs/famSb.log 2>&1; echo "famSb rc=$?" >> $OUT/logs/famSb.log
) &
wait
timeout 40 python3 -m pytest $T tests/gpu/test_gpu_symmetric_all_reduce.py > $OUT/logs/t_ar.log 2>&1
echo "t_ar rc=$?" >> $OUT/logs/t_ar.log
timeout $(( 585 - SECONDS )) python3 -c "
from pathlib import Path
from outpace.bench.multi_gpu import Plan, run_multi_gpu_bench
run_multi_gpu_bench(Path('$OUT/multi'), 'qwen3next80b,step35flash', Plan(step35flash_item_s=100,
                    seed_oracle=False, time_limit_s=$(( 570 - SECONDS ))), workdir=Path('.e2e_models'))" \
    > $OUT/logs/multi.log 2>&1
echo "multi rc=$?" >> $OUT/logs/multi.log
cp $OUT/multi/multi_gpu.json $OUT/multi/timeline_* $OUT/logs/ 2>/dev/null
for d in famSq famSb; do cp $OUT/$d/families.json $OUT/logs/families_$d.json 2>/dev/null; done
tar czf $OUT/logs.tgz -C $OUT logs
for n in t_gpu0 t_ar; do echo "== $n"; grep -c PASSED $OUT/logs/$n.log; grep -E "FAILED|ERROR| failed| passed|rc=" $OUT/logs/$n.log | tail -n 8; done
echo "== routing"; grep -E "tokens|rc=|Error" $OUT/logs/routing.log | cut -c1-170
for d in famSq famSb; do echo "== $d"; grep -v "%|" $OUT/logs/$d.log | grep -v "^\s*$" | grep -v -i "warn\|legend\|capturing" | tail -n 7; done
echo "== multi"; grep -v "%|" $OUT/logs/multi.log | grep -v "^\s*$" | grep -E "batch|built|target|rc=|Error|not run|skip" | tail -12
