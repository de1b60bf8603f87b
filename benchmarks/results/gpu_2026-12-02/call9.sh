#!/usr/bin/env bash
# Device call 9 of gpu_2026-12-02 (nvidia-h200), from .snap/ (a git archive of the commit holding this script):
# where Qwen3.5 MTP's steady step loses ~65 us beyond its replay (benchmarks/scripts/diag_spec_gaps.py), then
# the GPU tests call 8's limit cut (tests/gpu/test_gpu.py after the zoo drafters' test), in what time is left.
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT/logs
timeout 240 python3 benchmarks/scripts/diag_spec_gaps.py --family qwen35 --methods none mtp --workdir /tmp/e2e \
  --out $OUT/logs/gaps_qwen35.json > $OUT/logs/gaps_qwen35.log 2>&1
echo "rc=$?" >> $OUT/logs/gaps_qwen35.log
rm -rf /tmp/e2e
left=$((400 - SECONDS)); [ $left -lt 30 ] && left=30
timeout $left python3 -m pytest -q -p no:cacheprovider --tb=short -rf tests/gpu/test_gpu.py \
  --deselect "tests/gpu/test_gpu.py::test_zoo_drafters_lossless_fp32_on_gpu" > $OUT/logs/pytest.log 2>&1
echo "rc=$?" >> $OUT/logs/pytest.log
sed -i -E 's/\r/\n/g' $OUT/logs/*.log
sed -i -E '/it\/s|s\/it|tensor\/s/d' $OUT/logs/*.log
tar czf $OUT/logs.tgz -C $OUT logs
cat $OUT/logs/gaps_qwen35.json; grep -E "rc=|Error" $OUT/logs/gaps_qwen35.log | tail -3
tail -n 4 $OUT/logs/pytest.log
rm -rf $OUT/logs
