#!/usr/bin/env bash
# Device call 4 (nvidia-h200-x2), from .snap/ (a git archive of HEAD), the session's last 256 s: the GPU tests of
# the quantized kernels and routing after 1ef69ca (swap_ab removed; the launch-option tests in bf16 on the GPU,
# whose 512-column float32 launches failed in call 3). One GPU each, side by side, each test's name printed.
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT/logs
T="-v -p no:cacheprovider --tb=short -rf"
( export CUDA_VISIBLE_DEVICES=0
  timeout 140 python3 -m pytest $T tests/kernels/test_fp8_linear.py tests/kernels/test_quant_moe_kernels.py \
      > $OUT/logs/t_gpu0.log 2>&1; echo "t_gpu0 rc=$?" >> $OUT/logs/t_gpu0.log
) &
( export CUDA_VISIBLE_DEVICES=1
  timeout 140 python3 -m pytest $T tests/layers/test_fused_projection_fp8.py tests/kernels/test_moe_routing.py \
      > $OUT/logs/t_gpu1.log 2>&1; echo "t_gpu1 rc=$?" >> $OUT/logs/t_gpu1.log
) &
wait
tar czf $OUT/logs.tgz -C $OUT logs
for n in t_gpu0 t_gpu1; do echo "== $n"; grep -c PASSED $OUT/logs/$n.log; grep -E "FAILED|ERROR| failed| passed|rc=" $OUT/logs/$n.log | tail -n 10; tail -n 2 $OUT/logs/$n.log | cut -c1-200; done
