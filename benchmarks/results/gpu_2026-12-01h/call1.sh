#!/usr/bin/env bash
# Device call 1 of gpu_2026-12-01h (nvidia-h200), from .snap/ (a git archive of the commit holding this script):
# where DeepSeek's MTP row of bench e2e loses its closed batch at temperature 0.8 (gpu_2026-12-01g call 5: about
# 0.4 s a timed prompt): diag_first_use.py's family mode on the zoo target, then on the widened one.
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT/logs
timeout 200 python3 benchmarks/scripts/diag_first_use.py family deepseek mtp > $OUT/logs/diag_zoo.log 2>&1
echo "rc=$?" >> $OUT/logs/diag_zoo.log
timeout $(( 420 - SECONDS )) python3 benchmarks/scripts/diag_first_use.py family deepseek mtp --widened > $OUT/logs/diag_wide.log 2>&1
echo "rc=$?" >> $OUT/logs/diag_wide.log
tar czf $OUT/logs.tgz -C $OUT logs
for f in diag_zoo diag_wide; do echo "== $f"; cut -c1-600 $OUT/logs/$f.log | grep -v "^\s*$" | tail -n 40; done
