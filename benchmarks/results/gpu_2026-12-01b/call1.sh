#!/usr/bin/env bash
# Device call 1 of gpu_2026-12-01b (nvidia-h200, one GPU; gpu_2026-12-01 call 4 rerun after b7f088c), from .snap/ (a git archive of HEAD): the MTP oracle of Qwen3-Next-80B
# whole in block FP8 with its MTP layer, alone in a fresh process (call 3 ran it after the plain engine in the
# same process and ran out of memory).
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT/logs
timeout 480 python3 -c "
import json
from pathlib import Path
from outpace.bench.families import bench_shapes, run_mtp_oracle
shape = bench_shapes('fp8', ['qwen3-next-80b'])['qwen3-next-80b']
result = run_mtp_oracle(shape.config, Path('.fam/mtp'))
Path('$OUT/mtp_oracle.json').write_text(json.dumps(result, indent=1))
print('build', round(result['build_s'], 1), 's')
for row in result['rows']:
    print('batch', row['batch'], 'step ms by drafts', {k: round(v, 3) for k, v in row['step_ms'].items()})
    for s in row['speedups']:
        print('   acceptance', s['acceptance'], 'drafts', s['num_drafts'], 'speedup', round(s['speedup'], 3),
              'tokens/s', round(s['tokens_per_s'], 1))
" > $OUT/logs/mtp.log 2>&1
echo "mtp rc=$?" >> $OUT/logs/mtp.log
tar czf $OUT/logs.tgz -C $OUT logs
grep -v "%|" $OUT/logs/mtp.log | grep -E "build|batch|acceptance|rc=|Error" | tail -n 16
