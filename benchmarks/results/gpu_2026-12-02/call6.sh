#!/usr/bin/env bash
# Device call 6 of gpu_2026-12-02 (nvidia-h200), from .snap/ (a git archive of the commit holding this script):
# the whole Qwen3-Next-80B-A3B in block FP8 with its MTP layer, its step costs by draft count again on today's code
# (the MTP window update in one launch, padding rows routed nowhere, the DeltaNet step under PDL; last measured
# in gpu_2026-12-01b call 1), alone in a fresh process; then the DeltaNet step kernel's GPU tests (call 5's run of
# that file was cut by its limit before them).
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT/logs
timeout 330 python3 -c "
import json
from pathlib import Path
from outpace.bench.families import bench_shapes, run_mtp_oracle
shape = bench_shapes('fp8', ['qwen3-next-80b'])['qwen3-next-80b']
result = run_mtp_oracle(shape.config, Path('.fam/mtp'))
Path('$OUT/mtp_oracle.json').write_text(json.dumps(result))
print('build', round(result['build_s'], 1), 's')
for row in result['rows']:
    print('batch', row['batch'], 'step ms by drafts', {k: round(v, 3) for k, v in row['step_ms'].items()})
" > $OUT/logs/mtp.log 2>&1
echo "mtp rc=$?" >> $OUT/logs/mtp.log
rm -rf .fam
timeout $(( 470 - SECONDS )) python3 -m pytest -q -p no:cacheprovider --tb=short -rf -m gpu \
  tests/kernels/test_deltanet_step.py > $OUT/logs/pytest.log 2>&1
echo "rc=$?" >> $OUT/logs/pytest.log
sed -i -E 's/\r/\n/g' $OUT/logs/*.log
sed -i -E '/it\/s|s\/it|tensor\/s/d' $OUT/logs/*.log
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $OUT/logs
tar xzf $OUT/logs.tgz -O logs/mtp.log | grep -E "build|batch|rc=|Error" | tail -n 6
tar xzf $OUT/logs.tgz -O logs/pytest.log | tail -n 4
