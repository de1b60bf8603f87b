#!/usr/bin/env bash
# Device call 11 of gpu_2026-12-02 (nvidia-h200), from .snap/ (a git archive of the commit holding this script):
# the GPU tests of gated DeltaNet's step kernel with fewer barriers (call 10's limit cut them), then
# diag_spec_gaps.py with its GPU busy / idle figures fixed (call 9 counted the steps' annotations as GPU work).
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT/logs
timeout 100 python3 -m pytest -q -p no:cacheprovider --tb=short -rf -m gpu tests/kernels/test_deltanet_step.py \
  > $OUT/logs/pytest.log 2>&1
echo "rc=$?" >> $OUT/logs/pytest.log
timeout $((300 - SECONDS)) python3 benchmarks/scripts/diag_spec_gaps.py --family qwen35 --methods none mtp \
  --workdir /tmp/e2e --out $OUT/logs/gaps_qwen35.json > $OUT/logs/gaps_qwen35.log 2>&1
echo "rc=$?" >> $OUT/logs/gaps_qwen35.log
sed -i -E 's/\r/\n/g' $OUT/logs/*.log
sed -i -E '/it\/s|s\/it|tensor\/s/d' $OUT/logs/*.log
tar czf $OUT/logs.tgz -C $OUT logs
tail -n 3 $OUT/logs/pytest.log
python3 -c "
import json
for r in json.load(open('$OUT/logs/gaps_qwen35.json')):
    print({k: v for k, v in r.items() if k != 'largest_gaps_us_a_step'}); print(r['largest_gaps_us_a_step'][:5])
" 2>&1 | tail -n 6; grep -E "rc=|Error" $OUT/logs/gaps_qwen35.log | tail -n 3
rm -rf $OUT/logs
