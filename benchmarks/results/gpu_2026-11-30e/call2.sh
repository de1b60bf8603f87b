#!/usr/bin/env bash
# Device call 2 (nvidia-h200-x2), from .snap/ (a git archive of HEAD), one GPU each, side by side:
#   GPU 0: DeepSeek-V2-Lite after the fused MLA's q_proj moved into the down kernel (_absorb_kernel): the fused
#          block's GPU tests, step timelines at batch 1 (normal and batch-invariant), bench families beside
#          gpu_2026-11-30c call 4 (c4famA), then block FP8.
#   GPU 1: gated DeltaNet's step kernel over value-column splits: its GPU tests, verify timelines (Qwen3.5 and
#          the e2e MTP step), bench families Qwen3.5 / Qwen3-Next slice beside gpu_2026-11-30d call 3 (d3famB) and
#          gpu_2026-11-30c call 4 (c4famB), bench e2e --family qwen35 at batch 1 (MTP target 2.0x), then the
#          batch-invariant mode's cost on Llama-3.1-8B at 128 KV rows a split.
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT/logs
( export CUDA_VISIBLE_DEVICES=0
  timeout 150 python3 -m pytest -q tests/kernels/test_mla_fused.py > $OUT/logs/t_mla_fused.log 2>&1
  echo "t_mla_fused rc=$?" >> $OUT/logs/t_mla_fused.log
  timeout 100 python3 benchmarks/scripts/step_timeline.py $OUT/logs/tl deepseek-v2-lite@1 --lines 0 > $OUT/logs/tl.log 2>&1
  echo "tl rc=$?" >> $OUT/logs/tl.log
  timeout 100 python3 benchmarks/scripts/step_timeline.py $OUT/logs/tl deepseek-v2-lite@1 --lines 0 \
      --batch-invariant > $OUT/logs/tlbi.log 2>&1; echo "tlbi rc=$?" >> $OUT/logs/tlbi.log
  timeout $(( 420 - SECONDS )) python3 -m outpace.bench.families --out $OUT/famA --no-verify --compare-with c4famA \
      --shapes deepseek-v2-lite > $OUT/logs/famA.log 2>&1
  echo "famA rc=$?" >> $OUT/logs/famA.log
  timeout $(( 560 - SECONDS )) python3 -m outpace.bench.families --out $OUT/famQ --no-verify --quantized fp8 \
      --shapes deepseek-v2-lite > $OUT/logs/famQ.log 2>&1
  echo "famQ rc=$?" >> $OUT/logs/famQ.log ) &
( export CUDA_VISIBLE_DEVICES=1
  timeout 120 python3 -m pytest -q tests/kernels/test_deltanet_step.py > $OUT/logs/t_deltanet.log 2>&1
  echo "t_deltanet rc=$?" >> $OUT/logs/t_deltanet.log
  timeout 200 python3 benchmarks/scripts/verify_timeline.py $OUT/logs/vt qwen3.5@1 e2e:qwen35:mtp@1 \
      --workdir .e2e_models > $OUT/logs/vt.log 2>&1; echo "vt rc=$?" >> $OUT/logs/vt.log
  timeout $(( 400 - SECONDS )) python3 -m outpace.bench.families --out $OUT/famB --no-verify \
      --compare-with d3famB c4famB --shapes qwen3.5,qwen3-next-80b-slice > $OUT/logs/famB.log 2>&1
  echo "famB rc=$?" >> $OUT/logs/famB.log
  timeout $(( 560 - SECONDS )) python3 -m outpace bench e2e --family qwen35 --batch-sizes 1 \
      --methods none mtp --out $OUT/e2e --workdir .e2e_models > $OUT/logs/e2e.log 2>&1
  echo "e2e rc=$?" >> $OUT/logs/e2e.log ) &
wait
for d in famA famQ famB; do cp $OUT/$d/families.json $OUT/logs/families_$d.json 2>/dev/null; done
cp $OUT/e2e/*.json $OUT/logs/ 2>/dev/null
tar czf $OUT/logs.tgz -C $OUT logs
for n in t_mla_fused t_deltanet; do echo "== $n"; grep -E "passed|failed|error|rc=" $OUT/logs/$n.log | tail -n 3; done
for n in tl tlbi; do echo "== $n"; grep -E "span|Error|rc=" $OUT/logs/$n.log | tail -n 3; done
echo "== vt"; grep -E "replay span" -A6 $OUT/logs/vt.log | cut -c1-120; tail -n 2 $OUT/logs/vt.log
for d in famA famQ famB; do echo "== $d"; grep -v "%|" $OUT/logs/$d.log | grep -v "^\s*$" | grep -v -i "warn\|legend\|capturing" | tail -n 10; done
echo "== e2e"; grep -v "%|" $OUT/logs/e2e.log | grep -v "^\s*$" | tail -n 8
