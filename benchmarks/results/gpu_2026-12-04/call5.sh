#!/usr/bin/env bash
# Device call 5 of gpu_2026-12-04 (nvidia-h200), from the checkout: the MLA merge's tokens a program
# (mla_kernels.combine_block_tokens; W_UV is read once a program, so once a token at the shipped 1): (1) the two
# kernels alone, DeepSeek-V2-Lite's and V3's heads at batch 8 and 32 (mla_decode_parts.py --sweep combine_tokens);
# (2) in the DeepSeek-V3 slice's decode step (decode_settings.py mla_combine_v3).
set -u
export PYTHONUNBUFFERED=1
mkdir -p $OUT
export PYTHONPATH=.
timeout 100 python3 benchmarks/scripts/mla_decode_parts.py $OUT/parts --sweep combine_tokens --batches 8 32 \
  > $OUT/parts.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/parts.log
timeout $(( 250 - SECONDS )) python3 benchmarks/scripts/decode_settings.py $OUT/combine_v3.json mla_combine_v3 \
  > $OUT/combine_v3.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/combine_v3.log
sed -i -E 's/\r/\n/g' $OUT/*.log
tar -czf $OUT/logs.tgz -C $OUT parts.log combine_v3.log $(cd $OUT && ls combine_v3.json parts/*.json 2>/dev/null)
grep -v Warning $OUT/parts.log | grep -E "us/call|rc=|Error" | tail -n 24
grep -v Warning $OUT/combine_v3.log | tail -n 6
