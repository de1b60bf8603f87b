#!/usr/bin/env bash
# Device call 3 of gpu_2026-12-01f (nvidia-h200), from .snap/ (a git archive of the commit holding this script):
# attention output gates stored by the attention's launch (c36f62e) and DeepSeek's fused residual stack (a7dcf6d):
# their GPU tests, then bench families of the Step slice, the Qwen3-Next slice and Qwen3.5.
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT/logs
T="-v -p no:cacheprovider --tb=short -rf"
timeout 60 python3 -m pytest $T tests/kernels/test_gated_attention.py -k "cuda or gpu or bf16" > $OUT/logs/t_gate.log 2>&1
echo "rc=$?" >> $OUT/logs/t_gate.log
timeout 190 python3 -m pytest $T tests/gpu/test_gpu_moe_families.py -k "fused_residual" > $OUT/logs/t_fused.log 2>&1
echo "rc=$?" >> $OUT/logs/t_fused.log
timeout $(( 585 - SECONDS )) python3 -m outpace.bench.families --out $OUT/fam --no-verify --time-limit $(( 575 - SECONDS )) \
  --shapes step-3.5-flash-slice,qwen3-next-80b-slice,qwen3.5 > $OUT/logs/fam.log 2>&1
echo "rc=$?" >> $OUT/logs/fam.log
tar czf $OUT/logs.tgz -C $OUT logs
for t in t_gate t_fused; do echo "== $t"; grep -E "FAILED|ERROR| failed| passed|rc=" $OUT/logs/$t.log | tail -n 8; done
echo "== fam"; grep -v "%|" $OUT/logs/fam.log | grep -E "^[a-z0-9.-]+ +[0-9]|kernels|left|rc=|Error" | tail -n 14
