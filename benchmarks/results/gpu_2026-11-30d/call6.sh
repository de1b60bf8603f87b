#!/usr/bin/env bash
# Device call 6 (nvidia-h200), from .snap/ (a git archive of HEAD): the MLA + MoE batch-invariant GPU test
# (its tree case now on eager steps) with the mode's MLA splits of 128 rows.
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT/logs
timeout 120 python3 -m pytest -q tests/gpu/test_batch_invariant_mla_moe_gpu.py > $OUT/logs/t_bi_ds.log 2>&1
echo "t_bi_ds rc=$?" >> $OUT/logs/t_bi_ds.log
grep -E "passed|failed|Error|rc=" $OUT/logs/t_bi_ds.log | tail -n 6
