#!/usr/bin/env bash
# Device call 4 (nvidia-h200-x2), from .snap/ (a git archive of HEAD), one GPU each, side by side:
#   GPU 0: verify_timeline.py for Qwen3.5 (n-gram drafts, replays alone) and for MTP on the widened zoo
#          Qwen3.5 (its chain of 1 and 2 against no draft); batch-invariant mode's cost on DeepSeek-V2-Lite
#          and Qwen3.5.
#   GPU 1: batch-invariant mode's cost on Gemma-3-12B and Nemotron-H-8B; Llama-3.1-8B plain decode against the
#          floor (bench gpu --parts b); bench e2e (Llama family) n-gram and standalone draft at batch 8 and 32.
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT/logs
( export CUDA_VISIBLE_DEVICES=0
  timeout 220 python3 benchmarks/scripts/verify_timeline.py $OUT/logs/vt qwen3.5@1 e2e:qwen35:mtp@1 \
      --workdir .e2e_models > $OUT/logs/vt.log 2>&1; echo "vt rc=$?" >> $OUT/logs/vt.log
  timeout $(( 530 - SECONDS )) python3 benchmarks/scripts/batch_invariant_speed.py --shapes deepseek-v2-lite,qwen3.5 \
      --out $OUT/logs/binvA.json > $OUT/logs/binvA.log 2>&1; echo "binvA rc=$?" >> $OUT/logs/binvA.log ) &
( export CUDA_VISIBLE_DEVICES=1
  timeout 240 python3 benchmarks/scripts/batch_invariant_speed.py --shapes gemma-3-12b,nemotron-h-8b \
      --out $OUT/logs/binvB.json > $OUT/logs/binvB.log 2>&1; echo "binvB rc=$?" >> $OUT/logs/binvB.log
  timeout 150 python3 -m outpace bench gpu --parts b --out $OUT/llama > $OUT/logs/llama.log 2>&1
  echo "llama rc=$?" >> $OUT/logs/llama.log
  timeout $(( 530 - SECONDS )) python3 -m outpace bench e2e --methods none ngram draft --batch-sizes 8 32 \
      --out $OUT/e2e --workdir .e2e_models > $OUT/logs/e2e.log 2>&1
  echo "e2e rc=$?" >> $OUT/logs/e2e.log ) &
wait
cp $OUT/llama/gpu_bench.json $OUT/logs/ 2>/dev/null; cp $OUT/e2e/*.json $OUT/logs/ 2>/dev/null
tar czf $OUT/logs.tgz -C $OUT logs
echo "== vt"; grep -E "kernel time" -A12 $OUT/logs/vt.log | cut -c1-120; tail -n 2 $OUT/logs/vt.log
for f in binvA binvB; do echo "== $f"; grep -A8 "against normal" $OUT/logs/$f.log; grep -E "Error|rc=" $OUT/logs/$f.log | tail -3; done
echo "== llama"; grep -v "%|" $OUT/logs/llama.log | grep -i -E "context|batch|floor|rc=" | tail -n 12
echo "== e2e"; grep -v "%|" $OUT/logs/e2e.log | grep -v "^\s*$" | tail -n 12
