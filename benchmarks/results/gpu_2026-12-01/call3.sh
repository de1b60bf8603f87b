#!/usr/bin/env bash
# Device call 3 (nvidia-h200, one GPU: two were not lent), from .snap/ (a git archive of HEAD).
#   tests/gpu/test_gpu_moe_families.py (not run since the route kernel's warps changed, c0403a9);
#   bench families --quantized fp8 qwen3-next-80b: the whole model in block FP8 on one H200 with its MTP layer
#   (issue 44; last run gpu_2026-11-29c: 164.0 tok/s at batch 1, MTP oracle 2.00x at acceptance 0.8).
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT/logs
T="-v -p no:cacheprovider --tb=short -rf"
timeout 170 python3 -m pytest $T tests/gpu/test_gpu_moe_families.py > $OUT/logs/t_moefam.log 2>&1
echo "t_moefam rc=$?" >> $OUT/logs/t_moefam.log
timeout $(( 585 - SECONDS )) python3 -m outpace.bench.families --out $OUT/famQ80 --no-verify --quantized fp8 \
    --shapes qwen3-next-80b > $OUT/logs/famQ80.log 2>&1
echo "famQ80 rc=$?" >> $OUT/logs/famQ80.log
cp $OUT/famQ80/families.json $OUT/logs/families_famQ80.json 2>/dev/null
tar czf $OUT/logs.tgz -C $OUT logs
echo "== t_moefam"; grep -E "FAILED|ERROR| failed| passed|rc=" $OUT/logs/t_moefam.log | tail -n 8
echo "== famQ80"; grep -v "%|" $OUT/logs/famQ80.log | grep -v "^\s*$" | grep -v -i "warn\|legend\|capturing" | tail -n 20
