#!/usr/bin/env bash
# Device call 26: call 25's GPU tests again after its two failures (a test defect: the q check monkeypatched
# draft on captured steps, which call it only while captured), with this session's changes: the profile's
# replays over idle rows (tests/engine/test_probe_replays.py, whose engines also profile at start-up) and a chain
# of MTP layers absorbing later prefill chunks as captured (test_gpu.py's prefill-chunk tests chunk tinypy's
# 3-layer chain in 64-token steps).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 230 python3 -m pytest -n 4 -q tests/speculative/test_mtp_past_the_chain.py tests/engine/test_probe_replays.py \
  tests/gpu/test_gpu.py -k "prefill_chunks or absorb or past_the_chain or probe" > $OUT/pytest.log 2>&1
echo "rc=$? after ${SECONDS}s" >> $OUT/pytest.log
sed -i -E 's/\r/\n/g' $OUT/pytest.log
sed -i -E '/(it\/s|s\/it)\]$/d' $OUT/pytest.log
grep -E "passed|failed|^FAILED|^E |rc=" $OUT/pytest.log | tail -n 30
