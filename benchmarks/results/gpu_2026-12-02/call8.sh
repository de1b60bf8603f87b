#!/usr/bin/env bash
# Device call 8 of gpu_2026-12-02 (nvidia-h200), from .snap/ (a git archive of the commit holding this script),
# NOT RUN this session (no device time left): MTP layers' input in one launch (models/drafts/mtp.py mtp_input, the
# embed_norm_pair kernel with its norms' offsets), written after call 7: the fused-stack and drafters' GPU tests,
# then the MTP rows it is for (Qwen3.5 and DeepSeek at batch 1) and the Qwen3.5 MTP step's kernels.
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT/logs/tl
timeout 150 python3 -m pytest -q -p no:cacheprovider --tb=short -rf tests/layers/test_fused_projection.py \
  "tests/gpu/test_gpu.py::test_zoo_drafters_lossless_fp32_on_gpu" tests/gpu/test_gpu_deepseek.py \
  > $OUT/logs/pytest.log 2>&1
echo "rc=$?" >> $OUT/logs/pytest.log
for fam in qwen35 deepseek; do
  timeout 170 python3 -m outpace bench e2e --family $fam --batch-sizes 1 --methods none mtp --out /tmp/out_$fam \
    --workdir /tmp/e2e_$fam > $OUT/logs/e2e_$fam.log 2>&1
  echo "rc=$?" >> $OUT/logs/e2e_$fam.log
  cp /tmp/out_$fam/*.json $OUT/logs/ 2>/dev/null
  [ $fam = qwen35 ] && timeout 90 python3 benchmarks/scripts/verify_timeline.py $OUT/logs/tl e2e:qwen35:mtp@1 \
    --workdir /tmp/e2e_qwen35 > $OUT/logs/tl/verify_timeline.log 2>&1
  rm -rf /tmp/e2e_$fam
done
sed -i -E 's/\r/\n/g' $OUT/logs/*.log $OUT/logs/tl/*.log
sed -i -E '/it\/s|s\/it|tensor\/s/d' $OUT/logs/*.log $OUT/logs/tl/*.log
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $OUT/logs
tar xzf $OUT/logs.tgz -O logs/pytest.log | tail -n 3
for f in qwen35 deepseek; do tar xzf $OUT/logs.tgz -O logs/e2e_$f.log | grep -E -A6 "^method|rc=" | tail -n 7; done
tar xzf $OUT/logs.tgz -O logs/tl/verify_timeline.log | grep -E "kernel time"
