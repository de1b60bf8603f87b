#!/bin/bash
# Call 6 (the device time left, ~100 s): diag_first_use.py family deepseek mtp on the zoo's tinyds, its output
# written as it runs.
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT
timeout 90 python3 benchmarks/scripts/diag_first_use.py family deepseek mtp > $OUT/diag_family.log 2>&1
echo "rc=$?"; grep -v "step of\|it/s\]" $OUT/diag_family.log | tail -12
