#!/usr/bin/env bash
# Device call 4 of gpu_2026-12-01h (nvidia-h200), from .snap/ (a git archive of the commit holding this script):
# after the length-class changes (warm-up lengths 1 to 8, p - 1 and p; routing and fused-rows arguments not
# specialised; routing and MLA-merge tiles by the token count's power of two): the routing GPU tests,
# diag_first_use.py on DeepSeek's zoo MTP engine, bench e2e's DeepSeek MTP row at batch 1 (closed batch), and
# DeepSeek-V2-Lite's decode (the routing kernel without its n = 1 variant).
set -u
cd .snap; export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p $OUT/logs
timeout 100 python3 -m pytest -q -p no:cacheprovider -x tests/kernels/test_moe_routing.py > $OUT/logs/t_routing.log 2>&1
echo "rc=$?" >> $OUT/logs/t_routing.log
timeout 150 python3 benchmarks/scripts/diag_first_use.py family deepseek mtp > $OUT/logs/diag_zoo.log 2>&1
echo "rc=$?" >> $OUT/logs/diag_zoo.log
timeout $(( 470 - SECONDS )) python3 -m outpace bench e2e --family deepseek --batch-sizes 1 --methods none mtp \
  --out $OUT/e2e --workdir /tmp/e2e_ds > $OUT/logs/e2e.log 2>&1
echo "rc=$?" >> $OUT/logs/e2e.log
timeout $(( 575 - SECONDS )) python3 -m outpace.bench.families --out $OUT/fam --no-verify --time-limit $(( 565 - SECONDS )) \
  --shapes deepseek-v2-lite > $OUT/logs/fam.log 2>&1
echo "rc=$?" >> $OUT/logs/fam.log
cp $OUT/e2e/*.json $OUT/fam/*.json $OUT/logs/ 2>/dev/null
tar czf $OUT/logs.tgz -C $OUT logs
echo "== routing"; tail -n 2 $OUT/logs/t_routing.log
echo "== diag"; grep -E "^(timed|warm-up|  step|rc)" $OUT/logs/diag_zoo.log | cut -c1-700
echo "== e2e"; grep -E -A6 "^method|rc=" $OUT/logs/e2e.log | tail -n 8
echo "== fam"; grep -v "%|" $OUT/logs/fam.log | grep -E "^[a-z0-9.-]+ +[0-9]|kernels|left|rc=|Error" | tail -n 6
