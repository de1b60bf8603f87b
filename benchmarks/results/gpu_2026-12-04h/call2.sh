#!/usr/bin/env bash
# Device call 2 of gpu_2026-12-04h (nvidia-h200): the INT4 one-row loop with one lop3 a nibble (quant_matmul_kernel.py
# _nibble_times, written in a session without a GPU). (1) its GPU tests; (2) int4_tiles.py --one-row with the PTX
# (shipped) and with OUTPACE_INT4_PTX=0 (the and + or of before, and the 16-row tiles' general nibbles); (3) bench
# families INT4 on the DeepSeek-V3 and Kimi-K2 slices (gpu_2026-12-04d call 1: 606.5 (71.5%) and 746.7 (76.1%) at
# batch 1); (4) one Kimi-K2 INT4 decode step kernel by kernel (OUTPACE_PDL=0), against gpu_2026-12-04d call 6's.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p $OUT
timeout 120 python3 -m pytest -q -p no:cacheprovider -n 4 --tb=short -rfE -m gpu tests/kernels/test_int4_linear.py \
  tests/kernels/test_quant_moe_kernels.py > $OUT/pytest.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/pytest.log
timeout 90 python3 benchmarks/scripts/int4_tiles.py $OUT/one_row_ptx.json --one-row > $OUT/one_row_ptx.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/one_row_ptx.log
OUTPACE_INT4_PTX=0 timeout 90 python3 benchmarks/scripts/int4_tiles.py $OUT/one_row_noptx.json --one-row \
  > $OUT/one_row_noptx.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/one_row_noptx.log
timeout 150 python3 -m outpace.bench.families --out $OUT/fam_int4 --no-verify --quantized int4 \
  --shapes deepseek-v3-slice,kimi-k2-slice > $OUT/fam_int4.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/fam_int4.log
OUTPACE_PDL=0 timeout $(( 570 - SECONDS )) python3 benchmarks/scripts/step_timeline.py $OUT/tl kimi-k2-slice@1 \
  --quantized int4 --lines 0 > $OUT/tl.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/tl.log
sed -i -E 's/\r/\n/g' $OUT/*.log
sed -i -E '/(it\/s|s\/it|tensor\/s)\]$/d' $OUT/*.log
gzip -k $OUT/tl/*.txt 2>/dev/null
tar -czf $OUT/logs.tgz -C $OUT $(cd $OUT && ls *.log *.json 2>/dev/null) $(cd $OUT && find fam_int4 tl -name "*.json" -o -name "*.txt.gz" 2>/dev/null)
grep -E "^(FAILED|ERROR)|passed|failed|rc=" $OUT/pytest.log | tail -n 8
for f in one_row_ptx one_row_noptx fam_int4 tl; do echo "== $f"; grep -v Warning $OUT/$f.log | tail -n 9; done
