#!/usr/bin/env bash
# Device call 16 (written for the next session with a device): MTP drafting now routes to experts only the rows
# whose output something reads (speculative/drafters/mtp.py _rows_read, after 1e95936). (1) On CUDA: the DeepSeek
# tests (captured speculation lossless in fp32, MTP layers of the zoo tinyds among them), the routed-rows kernel
# tests and the zoo drafters' lossless test; (2) bench e2e on the widened DeepSeek and Qwen3.5, MTP at batch 1 and
# 8: on an H100, compare with call 15 (DeepSeek MTP 717.7 tok/s, 1.88x, tau 2.83); on an H200, these are the
# figures for issue 43's MTP targets.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 170 python3 -m pytest -q -p no:cacheprovider -n 4 --tb=short -rfE tests/gpu/test_gpu_deepseek.py \
  tests/kernels/test_moe_kernel.py "tests/gpu/test_gpu.py::test_zoo_drafters_lossless_fp32_on_gpu" \
  tests/speculative/test_mtp_routed_rows.py > $OUT/pytest.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/pytest.log
for family in deepseek qwen35; do
  timeout $(( 590 - SECONDS )) python3 -m outpace bench e2e --family $family --batch-sizes 1 8 --methods none mtp \
    --out $OUT/e2e_$family --workdir /tmp/e2e_$family > $OUT/e2e_$family.log 2>&1
  echo "rc=$? after ${SECONDS}s" >> $OUT/e2e_$family.log
done
sed -i -E 's/\r/\n/g' $OUT/*.log
sed -i -E '/(it\/s|s\/it|tensor\/s)\]$/d' $OUT/*.log
grep -E "^(FAILED|ERROR)|passed|failed|rc=" $OUT/pytest.log | tail -n 8
for family in deepseek qwen35; do grep -E -A10 "^method|rc=" $OUT/e2e_$family.log | tail -n 12; done
