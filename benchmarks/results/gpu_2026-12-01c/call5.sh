#!/usr/bin/env bash
# Device call 5 of gpu_2026-12-01c (nvidia-h200, one GPU), from .snap/ (the code of calls 3 and 4): the MoE
# families' GPU tests (real vocabulary widths through the engine: the new argmax and row gather inside every
# family's captured step) and the hybrids' batch-invariant GPU test.
set -u
export PYTHONUNBUFFERED=1
mkdir -p $OUT/logs
cd .snap; export PYTHONPATH=.
timeout 175 python3 -m pytest -v tests/gpu/test_gpu_moe_families.py > $OUT/logs/moe_families.log 2>&1
echo "rc=$?" >> $OUT/logs/moe_families.log
timeout 80 python3 -m pytest -v tests/gpu/test_batch_invariant_hybrids_gpu.py > $OUT/logs/binv_hybrids.log 2>&1
echo "rc=$?" >> $OUT/logs/binv_hybrids.log
cd $OUT && tar czf logs.tgz logs
for f in logs/*.log; do echo "== $f"; grep -E "PASSED|FAILED|ERROR|XFAIL|passed|failed|rc=" $f | tail -n 20; done
rm -rf logs
