#!/usr/bin/env bash
# Device call 5 of gpu_2026-12-01h (nvidia-h200), from .snap/ (a git archive of the commit holding this script):
# the warm-up's prefixes from one block (call 4 left one MLA merge variant compiled after a 16-row prefix-cache
# hit): diag_first_use.py on DeepSeek's zoo MTP engine; the MLA kernel tests on the GPU (the merge's CHUNK by the
# token count's power of two); projection_tiles.py's new tiles for Qwen3-Next's in_proj_qkvz and out_proj.
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT/logs
timeout 150 python3 benchmarks/scripts/diag_first_use.py family deepseek mtp > $OUT/logs/diag_zoo.log 2>&1
echo "rc=$?" >> $OUT/logs/diag_zoo.log
timeout 150 python3 -m pytest -q -p no:cacheprovider -x tests/kernels/test_mla_kernel.py > $OUT/logs/t_mla.log 2>&1
echo "rc=$?" >> $OUT/logs/t_mla.log
timeout $(( 480 - SECONDS )) python3 benchmarks/scripts/projection_tiles.py $OUT/logs/tiles.json \
  "qwen3-next in_proj_qkvz" "qwen3-next out_proj" > $OUT/logs/tiles.log 2>&1
echo "rc=$?" >> $OUT/logs/tiles.log
tar czf $OUT/logs.tgz -C $OUT logs
echo "== diag"; grep -E "^(timed|warm-up|  step|rc|deepseek)" $OUT/logs/diag_zoo.log | cut -c1-400
echo "== mla"; tail -n 2 $OUT/logs/t_mla.log
echo "== tiles"; grep -E "m= |rc=" $OUT/logs/tiles.log
