#!/usr/bin/env bash
# How the GPU figures under benchmarks/ were made: one command on the device machine (H100), from the
# repository root, with the GPU tests first. Usage: bash benchmarks/gpu_run.sh OUT_DIR [bench parts]
set -uo pipefail
out=${1:?output folder}
parts=${2:-abcdef}
mkdir -p "$out"
if ls .whl/*.whl >/dev/null 2>&1; then  # packages the device image lacks (pytest, matplotlib), carried as wheels
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=.:/tmp/site
else
  export PYTHONPATH=.
fi
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_triton_attention.py tests/test_fused_ops.py tests/test_fused_projection.py \
  tests/test_batch_invariant.py tests/test_attention.py tests/test_cuda_graphs.py tests/test_gpu.py 2>&1 | tee "$out/gpu_tests.log" | tail -25
python3 -c "
from outpace.bench.attention import run_attention_bench
import json; json.dump(run_attention_bench(), open('$out/attention_bench.json', 'w'), indent=1)
" 2>&1 | tail -40
python3 -m outpace bench gpu --out "$out" --parts "$parts" 2>&1 | tee "$out/bench.log" | grep -v "it/s\]" | tail -40
