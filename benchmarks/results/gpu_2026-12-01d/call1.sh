#!/usr/bin/env bash
# Device call 1 of gpu_2026-12-01d (nvidia-h200-x2), from .snap/ (a git archive of 7256d97): the first GPU run of
# ac63df1 (the step's end in one launch), f72a844 (plain positions), 0d0c186 (n-gram history write in one launch)
# and 710fbbc (the Llama-family fused TP path ending row-parallel blocks with reduce_add_normalised).
#   GPU 0: the new kernels' tests, tests/gpu/test_gpu.py (captured zoo decode, drafters lossless), the MoE families'.
#   GPU 1 at the same time: bench families (kernels a step recounted), closed_batch_rounds.py for n-gram.
#   Then both GPUs: bench multi ep (DeepSeek-V3 and Step-3.5-Flash slices at EP = TP = 2), plain decode.
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p $OUT/logs
T="-v -p no:cacheprovider --tb=short -rf"
(
  export CUDA_VISIBLE_DEVICES=0
  timeout 150 python3 -m pytest $T tests/engine/test_commit_kernel.py tests/speculative/test_ngram_kernel.py \
    tests/gpu/test_gpu.py -k "not eager" > $OUT/logs/t_gpu.log 2>&1
  echo "rc=$?" >> $OUT/logs/t_gpu.log
  timeout 190 python3 -m pytest $T tests/gpu/test_gpu_moe_families.py > $OUT/logs/t_moe.log 2>&1
  echo "rc=$?" >> $OUT/logs/t_moe.log
) &
(
  export CUDA_VISIBLE_DEVICES=1
  timeout 200 python3 -m outpace.bench.families --out $OUT/fam --no-verify --time-limit 190 \
    --shapes qwen3-next-80b-slice,deepseek-v2-lite,step-3.5-flash-slice > $OUT/logs/fam.log 2>&1
  echo "rc=$?" >> $OUT/logs/fam.log
  timeout 140 python3 benchmarks/scripts/closed_batch_rounds.py --methods ngram --batches 8 32 \
    --rounds 5 --workdir .e2e --out $OUT/rounds.json > $OUT/logs/rounds.log 2>&1
  echo "rc=$?" >> $OUT/logs/rounds.log
) &
wait
timeout $(( 580 - SECONDS )) python3 -c "
from pathlib import Path
from outpace.bench.multi_gpu import Plan, run_multi_gpu_bench
run_multi_gpu_bench(Path('$OUT/multi_ep'), 'ep', Plan(seed_oracle=False, time_limit_s=$(( 565 - SECONDS ))),
                    workdir=Path('.e2e_models'))" > $OUT/logs/multi_ep.log 2>&1
echo "multi rc=$?" >> $OUT/logs/multi_ep.log
tar czf $OUT/logs.tgz -C $OUT logs
echo "== t_gpu"; grep -E "FAILED|ERROR| failed| passed|rc=" $OUT/logs/t_gpu.log | tail -n 8
echo "== t_moe"; grep -E "FAILED|ERROR| failed| passed|rc=" $OUT/logs/t_moe.log | tail -n 8
echo "== fam"; grep -v "%|" $OUT/logs/fam.log | tail -n 16
echo "== rounds"; grep -v "%|" $OUT/logs/rounds.log | tail -n 8
echo "== ep"; grep -v "%|" $OUT/logs/multi_ep.log | grep -v "^\s*$" | tail -14
