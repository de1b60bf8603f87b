#!/usr/bin/env bash
# Device call 22: the session's last device seconds (about 55 s of run time after a start): does an engine start
# on CUDA with the new captures? A hybrid (zoo/tinyqwen35) captures its prefill forwards below 64 tokens, and
# zoo/tinyds with MTP captures its MTP layers' absorb. Each engine generates a few prompts; the script prints
# what was captured and replayed, and with MTP whether the tokens equal plain decoding's (fp32).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 100 python3 - <<'PY' 2>&1 | grep -v -E "it/s|s/it" | tee $OUT/smoke.log
import time
from outpace import LLM, SamplingParams
from outpace.config import SpeculativeConfig
t0 = time.time()
ids = [(i * 37 + 5) % 120 for i in range(40)]
params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
kw = dict(device="cuda", dtype="float32", max_num_seqs=4)
llm = LLM("zoo/tinyds", speculative=SpeculativeConfig("mtp", num_steps=2), **kw)
g = llm.engine.runner.prefill_graphs
print("tinyds mtp: absorb graphs", len(g.absorbs), all(c.graph is not None for c in g.absorbs.values()), f"{time.time() - t0:.0f}s", flush=True)
before = sum(c.replays for c in g.absorbs.values())
mtp = [o.token_ids for o in llm.generate([ids[:5], ids[3:15], ids[10:26]], params)]
print("tinyds mtp: absorb replays", sum(c.replays for c in g.absorbs.values()) - before, flush=True)
plain = [o.token_ids for o in LLM("zoo/tinyds", **kw).generate([ids[:5], ids[3:15], ids[10:26]], params)]
print("tinyds mtp equals plain:", mtp == plain, f"{time.time() - t0:.0f}s", flush=True)
llm = LLM("zoo/tinyqwen35", **kw)
g = llm.engine.runner.prefill_graphs
print("tinyqwen35: prefill buckets", g.buckets, all(c.graph is not None for c in g.graphs.values()), f"{time.time() - t0:.0f}s", flush=True)
out = [o.token_ids for o in llm.generate([ids[:5], ids[:30]], params)]
print("tinyqwen35: forward replays", sum(c.replays for c in g.graphs.values()), out[0][:8], flush=True)
PY
