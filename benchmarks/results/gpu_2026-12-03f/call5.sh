#!/usr/bin/env bash
# Device call 5 of gpu_2026-12-03f (nvidia-h200): call 4's router A/B (bb2ecf2's code, per_token_max 16 against
# always) on DeepSeek-V2-Lite at batch 32, bf16 and block FP8 (there with 957d9e0's MLA settings in both arms), where
# call 3 and 4's bench families rows at batch 32 were 2.7-3.3% below earlier runs.
set -u
export PYTHONUNBUFFERED=1
mkdir -p $OUT
python3 - <<'PY'
p = ".snap_a/benchmarks/scripts/decode_settings.py"
s = open(p).read()
s = s.replace('from outpace.layers import fused_projection, mamba2_step_kernel, mla_fused',
              'from outpace.layers import fused_projection, mamba2_step_kernel, mla_fused, moe_routing_kernel')
s = s.replace('KNOBS = {', 'KNOBS = {\n    "per_token_max": (moe_routing_kernel, "per_token_max"),')
mla = '"fp8_scale_columns": 4, "fp8_widens": True'
s = s.replace('SWEEPS = {', 'SWEEPS = {\n'
    '    "router_v2": Sweep("deepseek-v2-lite", ((32, 512),), ({}, {"per_token_max": 1 << 30})),\n'
    f'    "router_v2_fp8": Sweep("deepseek-v2-lite", ((32, 512),), ({{{mla}}}, {{{mla}, "per_token_max": 1 << 30}}), "fp8"),\n')
open(p, "w").write(s)
PY
for s in router_v2 router_v2_fp8; do
  (cd .snap_a && PYTHONPATH=. timeout 140 python3 benchmarks/scripts/decode_settings.py $OUT/$s.json $s) > $OUT/$s.log 2>&1
done
sed -i -E 's/\r/\n/g' $OUT/*.log
for s in router_v2 router_v2_fp8; do grep -v Warning $OUT/$s.log | tail -n 3; done
