#!/usr/bin/env bash
# Device call 2 of gpu_2026-12-04c (nvidia-h200): (1) why pairs apart lost on the Step-3.5 slice in block FP8 (call 1):
# its decode step's kernels at batch 1 and 2 with pairs apart (4) and without (0), one build; (2) the whole
# Qwen3-Next-80B-A3B in block FP8 with its MTP layer: step costs by draft count (issue 44's MTP target), pairs apart
# as shipped (4).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p $OUT
timeout 150 python3 -c "
import tempfile
from pathlib import Path
from outpace.bench.families import bench_shapes, build, close
from outpace.bench.profile import _recapture_decode, decode_step_timeline
from outpace.layers import moe_kernels as mk
shape = bench_shapes('fp8', ['step-3.5-flash-slice'])['step-3.5-flash-slice']
with tempfile.TemporaryDirectory() as tmp:
    llm = build(Path(tmp), shape.config, max_num_seqs=2, graph_sizes=(1, 2))
    for apart in (4, 0):
        mk.pairs_apart_max_tokens = apart
        _recapture_decode(llm.engine)
        for b in (1, 2):
            lines = decode_step_timeline(llm, b, 512)
            Path('$OUT/tl_step_apart%d_b%d.txt' % (apart, b)).write_text('\n'.join(lines) + '\n')
            print(apart, b, lines[0])
    close(llm)
" > $OUT/tl.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/tl.log
timeout $(( 585 - SECONDS )) python3 -c "
import json
from pathlib import Path
from outpace.bench.families import bench_shapes, run_mtp_oracle
shape = bench_shapes('fp8', ['qwen3-next-80b'])['qwen3-next-80b']
result = run_mtp_oracle(shape.config, Path('/tmp/fam_mtp'))
Path('$OUT/mtp_oracle.json').write_text(json.dumps(result))
print('build', round(result['build_s'], 1), 's')
for row in result['rows']:
    print('batch', row['batch'], 'step ms by drafts', {k: round(v, 3) for k, v in row['step_ms'].items()})
" > $OUT/mtp.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/mtp.log
sed -i -E 's/\r/\n/g' $OUT/*.log
sed -i -E '/it\/s|s\/it|tensor\/s/d' $OUT/*.log
tar -czf $OUT/logs.tgz -C $OUT $(cd $OUT && ls *.log *.txt *.json 2>/dev/null)
grep -v Warn $OUT/tl.log | tail -n 6
grep -E "build|batch|rc=|Error" $OUT/mtp.log | tail -n 6
