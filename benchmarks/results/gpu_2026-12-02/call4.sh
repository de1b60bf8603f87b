#!/usr/bin/env bash
# Device call 4 of gpu_2026-12-02 (nvidia-h200), from .snap/ (a git archive of the commit holding this script),
# NOT RUN this session (no device time left): the kernels written after call 3, none yet run on a GPU (greedy chain
# verification's result in one launch, tree_kernels.greedy_chain; MTP's draft inputs, PendingRows.window and
# layer_tokens; a draft window's padding rows routed nowhere, layers/routed_rows.py): their tests, the MoE kernels'
# and the drafters' lossless GPU tests first, then the rows they are for (Qwen3.5 and
# DeepSeek MTP at batch 1, the Llama zoo's EAGLE3 chain and n-gram at batch 1) and the Qwen3.5 MTP step's kernels.
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT/logs/tl
timeout 240 python3 -m pytest -q tests/speculative/test_pending_window.py tests/kernels/test_tree_kernels.py \
  tests/kernels/test_moe_kernel.py tests/gpu/test_gpu.py tests/gpu/test_batch_invariant_hybrids_gpu.py \
  tests/gpu/test_gpu_deepseek.py > $OUT/logs/pytest.log 2>&1
echo "rc=$?" >> $OUT/logs/pytest.log
for fam in qwen35 deepseek; do
  timeout $([ $fam = deepseek ] && echo 230 || echo 170) python3 -m outpace bench e2e --family $fam --batch-sizes 1 \
    --methods none mtp --out /tmp/out_$fam --workdir /tmp/e2e_$fam > $OUT/logs/e2e_$fam.log 2>&1
  echo "rc=$?" >> $OUT/logs/e2e_$fam.log
  cp /tmp/out_$fam/*.json $OUT/logs/ 2>/dev/null
  [ $fam = qwen35 ] && timeout 120 python3 benchmarks/scripts/verify_timeline.py $OUT/logs/tl e2e:qwen35:mtp@1 \
    --workdir /tmp/e2e_qwen35 > $OUT/logs/tl/verify_timeline.log 2>&1
  rm -rf /tmp/e2e_$fam
done
timeout $(( 580 - SECONDS )) python3 -m outpace bench e2e --batch-sizes 1 --methods none eagle3 ngram \
  --out /tmp/out_llama --workdir /tmp/e2e > $OUT/logs/e2e_llama.log 2>&1
echo "rc=$?" >> $OUT/logs/e2e_llama.log
cp /tmp/out_llama/*.json $OUT/logs/ 2>/dev/null
sed -i -E 's/\r/\n/g' $OUT/logs/*.log $OUT/logs/tl/*.log
sed -i -E '/it\/s|s\/it|tensor\/s/d' $OUT/logs/*.log $OUT/logs/tl/*.log
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $OUT/logs
tar xzf $OUT/logs.tgz -O logs/pytest.log | tail -n 4
for f in qwen35 deepseek llama; do tar xzf $OUT/logs.tgz -O logs/e2e_$f.log | grep -E -A8 "^method|rc=" | tail -n 9; done
tar xzf $OUT/logs.tgz -O logs/tl/verify_timeline.log | grep -E "kernel time"
