#!/usr/bin/env bash
# Device call 4 of gpu_2026-12-04c (nvidia-h200): the Qwen3-Next slice's and DeepSeek-V2-Lite's block-FP8 decode steps
# at batch 2, kernel by kernel, with pairs apart (4) and without (0), one build each: where call 1's step gains
# come from, when pair_order.py (call 3) found the grouped kernels alone slower apart.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p $OUT
for shape in qwen3-next-80b-slice deepseek-v2-lite; do
timeout 200 python3 -c "
import tempfile
from pathlib import Path
from outpace.bench.families import bench_shapes, build, close
from outpace.bench.profile import _recapture_decode, decode_step_timeline
from outpace.layers import moe_kernels as mk
shape = bench_shapes('fp8', ['$shape'])['$shape']
with tempfile.TemporaryDirectory() as tmp:
    llm = build(Path(tmp), shape.config, max_num_seqs=2, graph_sizes=(1, 2))
    for apart in (4, 0):
        mk.pairs_apart_max_tokens = apart
        _recapture_decode(llm.engine)
        lines = decode_step_timeline(llm, 2, 512)
        Path('$OUT/tl_${shape}_apart%d_b2.txt' % apart).write_text('\n'.join(lines) + '\n')
        print(apart, lines[0], lines[-1])
    close(llm)
" > $OUT/tl_$shape.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/tl_$shape.log
done
sed -i -E 's/\r/\n/g' $OUT/*.log
sed -i -E '/it\/s|s\/it|tensor\/s/d' $OUT/*.log
tar -czf $OUT/logs.tgz -C $OUT $(cd $OUT && ls *.log *.txt 2>/dev/null)
for f in $OUT/tl_*.log; do grep -v Warn $f | tail -n 3; done
