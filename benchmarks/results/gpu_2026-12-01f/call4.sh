#!/usr/bin/env bash
# Device call 4 of gpu_2026-12-01f (nvidia-h200), from .snap/ (a git archive of the commit holding this script):
# where the gated attention store differs from attention then sigmoid_gate in bf16 (call 3: four verify cases),
# the batch-invariant mode's hybrids with the gate in the attention (MTP gives plain decoding's bits), and the
# V3-style DeepSeek fused residual stack's GPU test (cut by call 3's timeout).
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT/logs
T="-v -p no:cacheprovider --tb=short -rf"
timeout 100 env PYTHONPATH=.:tests python3 benchmarks/scripts/diag_gated_attention_bits.py > $OUT/logs/bits.log 2>&1
echo "rc=$?" >> $OUT/logs/bits.log
timeout 150 python3 -m pytest $T tests/gpu/test_gpu_moe_families.py -k "fused_residual and v3" > $OUT/logs/t_v3.log 2>&1
echo "rc=$?" >> $OUT/logs/t_v3.log
timeout $(( 470 - SECONDS )) python3 -m pytest $T tests/gpu/test_batch_invariant_hybrids_gpu.py > $OUT/logs/t_inv.log 2>&1
echo "rc=$?" >> $OUT/logs/t_inv.log
tar czf $OUT/logs.tgz -C $OUT logs
echo "== bits"; tail -n 15 $OUT/logs/bits.log
for t in t_v3 t_inv; do echo "== $t"; grep -E "FAILED|ERROR| failed| passed|rc=" $OUT/logs/$t.log | tail -n 8; done
