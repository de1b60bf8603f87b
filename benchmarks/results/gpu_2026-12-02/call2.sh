#!/usr/bin/env bash
# Device call 2 of gpu_2026-12-02 (nvidia-h200), from .snap/ (a git archive of the commit holding this script):
# where the widened Qwen3.5's MTP step spends its time over a plain step (call 1: 3.92 ms plain, 4.52 with one
# draft, 4.58 with two), kernel by kernel at 1, 2 and 3 tokens a sequence (t = 1: a zero-draft step that runs the
# MTP forward, not a held one); then the same with HOLD_ROWS = 0 (the pending window 4 rows, not 12: what the
# MTP layers' forward costs over the rows a verify leaves, without the rows zero-draft steps may hold).
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT/tl $OUT/tl0
timeout 300 python3 benchmarks/scripts/verify_timeline.py $OUT/tl e2e:qwen35:mtp@1 --workdir /tmp/e2e_q35 \
  > $OUT/tl/verify_timeline.log 2>&1
echo "rc=$?" >> $OUT/tl/verify_timeline.log
timeout $(( 560 - SECONDS )) python3 -c "
import runpy, sys
import outpace.speculative.drafters.mtp as mtp
mtp.HOLD_ROWS = 0
sys.argv = ['verify_timeline.py', '$OUT/tl0', 'e2e:qwen35:mtp@1', '--workdir', '/tmp/e2e_q35']
runpy.run_path('benchmarks/scripts/verify_timeline.py', run_name='__main__')
" > $OUT/tl0/verify_timeline.log 2>&1
echo "rc=$?" >> $OUT/tl0/verify_timeline.log
for d in tl tl0; do
  sed -i -E 's/\r/\n/g' $OUT/$d/verify_timeline.log
  sed -i -E '/it\/s|s\/it|tensor\/s/d' $OUT/$d/verify_timeline.log
done
tar czf $OUT/tl.tgz -C $OUT tl tl0 && rm -rf $OUT/tl $OUT/tl0
for d in tl tl0; do tar xzf $OUT/tl.tgz -O $d/verify_timeline.log | grep -vE "widening|capturing" | head -n 28; done
