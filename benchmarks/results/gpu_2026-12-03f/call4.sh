#!/usr/bin/env bash
# Device call 4 of gpu_2026-12-03f (nvidia-h200): (1) the fixed engine-capture test of the fused MLA block (5575165);
# (2) an A/B in one engine of the router logits' per-token sums against the tl.dot path beyond 16 tokens: the code of
# bb2ecf2 (which has both, chosen by moe_routing_kernel.per_token_max), its decode_settings.py given that knob and two
# sweeps here, the decode graphs captured again per setting; (3) bench families bf16 on the two MoE shapes call 3's
# limit left out, on 5575165.
# .snap_a: git archive of bb2ecf2 (outpace, benchmarks/scripts), the zoo linked.
set -u
export PYTHONUNBUFFERED=1
mkdir -p $OUT
python3 - <<'PY'
p = ".snap_a/benchmarks/scripts/decode_settings.py"
s = open(p).read()
s = s.replace('from outpace.layers import fused_projection, mamba2_step_kernel, mla_fused',
              'from outpace.layers import fused_projection, mamba2_step_kernel, mla_fused, moe_routing_kernel')
s = s.replace('KNOBS = {', 'KNOBS = {\n    "per_token_max": (moe_routing_kernel, "per_token_max"),')
s = s.replace('SWEEPS = {', 'SWEEPS = {\n' + "".join(
    f'    "router_{k}": Sweep("{v}", ((8, 512), (32, 512)), ({{}}, {{"per_token_max": 1 << 30}})),\n'
    for k, v in (("step", "step-3.5-flash-slice"), ("qwen3next", "qwen3-next-80b-slice"))))
open(p, "w").write(s)
PY
(cd .snap && PYTHONPATH=. timeout 150 python3 -m pytest -q -p no:cacheprovider --tb=short \
  "tests/kernels/test_mla_fused.py::test_the_engine_captures_the_fused_block") > $OUT/pytest.log 2>&1
echo "rc=$?" >> $OUT/pytest.log
for s in step qwen3next; do
  (cd .snap_a && PYTHONPATH=. timeout 130 python3 benchmarks/scripts/decode_settings.py $OUT/router_$s.json router_$s) \
    > $OUT/router_$s.log 2>&1
done
(cd .snap && PYTHONPATH=. timeout $(( 560 - SECONDS )) python3 -m outpace.bench.families --out $OUT/fam --no-verify \
  --shapes qwen3-next-80b-slice,deepseek-v2-lite) > $OUT/fam.log 2>&1
sed -i -E 's/\r/\n/g' $OUT/*.log
sed -i -E '/it\/s|s\/it|tensor\/s/d' $OUT/*.log
grep -E "passed|failed|rc=|Error" $OUT/pytest.log | tail -n 5
for s in step qwen3next; do grep -v Warning $OUT/router_$s.log | tail -n 4; done
grep -v Warning $OUT/fam.log | tail -n 10
