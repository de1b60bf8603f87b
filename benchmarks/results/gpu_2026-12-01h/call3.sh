#!/usr/bin/env bash
# Device call 3 of gpu_2026-12-01h (nvidia-h200), from .snap/ (a git archive of the commit holding this script):
# diag_first_use.py's family mode on DeepSeek's zoo MTP engine, now naming what each compile's specialisation
# changed and each prefill's chunks (call 2: compiles inside timed requests after the warm-up of 63ca15b).
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT/logs
timeout 200 python3 benchmarks/scripts/diag_first_use.py family deepseek mtp > $OUT/logs/diag_zoo.log 2>&1
echo "rc=$?" >> $OUT/logs/diag_zoo.log
tar czf $OUT/logs.tgz -C $OUT logs
grep -E "^(timed|warm-up|  step|rc)" $OUT/logs/diag_zoo.log | cut -c1-1500
