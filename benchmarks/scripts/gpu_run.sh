#!/usr/bin/env bash
# How the GPU figures under benchmarks/results/ were made, on the device machine (H100), from the repository
# root, in two commands (each fits the device's 10-minute limit):
#   bash benchmarks/scripts/gpu_run.sh OUT_DIR checks        # every test of the GPU-touching files, on the GPU;
#                                                    # the attention backends; the profiles; bf16 acceptance
#   bash benchmarks/scripts/gpu_run.sh OUT_DIR bench [parts] # outpace bench gpu (parts of abef, all by default)
#   bash benchmarks/scripts/gpu_run.sh OUT_DIR e2e [methods]  # outpace bench e2e (the zoo widened to 8B; methods of
#                                                    # none eagle3 eagle3-tree mtp dflash draft ngram, all by
#                                                    # default; rows of earlier runs into OUT_DIR are kept)
#   bash benchmarks/scripts/gpu_run.sh OUT_DIR multi [parts] # on nvidia-h200-x2 (MULTI_GPUS=4 on -x4: TP/EP = 4): outpace bench multi (issue 20: TP = 2 vs
#                                                    # TP = 1 correctness, 8B/70B-shaped TP = 2 decode vs the 2-GPU
#                                                    # floor, EAGLE3 at TP = 2, 2 data-parallel replicas, plain and
#                                                    # with EAGLE3); parts of correctness,tp_speed,dp,dp_eagle3
#                                                    # and issue 46's item1 (graph replays per decode step with
#                                                    # NCCL inside at TP = 2, per-rank memory sizing, tinyqwen35
#                                                    # and a Qwen3-Next slice at TP = 2: ~3-4 min on 2 H200s)
#                                                    # and qwen3next80b (Qwen3-Next-80B-A3B whole, bf16, random
#                                                    # weights built on the GPUs, TP = 2: decode vs the floor, MTP
#                                                    # under ORACLE acceptance: ~3-4 min) and ep (issue 46 item 2:
#                                                    # DeepSeek-V3 and Step-3.5-Flash layer slices at EP = TP = 2,
#                                                    # decode vs the floor, MTP under ORACLE acceptance: ~4 min)
#                                                    # and step35flash (issue 46 item 3: Step-3.5-Flash whole, 45
#                                                    # layers, in block FP8 as stepfun-ai/Step-3.5-Flash-FP8, ~200
#                                                    # GB, random weights built on the GPUs, EP = TP = 2: each GPU
#                                                    # ~92 GiB; decode vs the floor, MTP under ORACLE acceptance:
#                                                    # ~5-7 min; 2 GPUs only: at 4 or 8 a rank's part of the shared
#                                                    # expert cuts an FP8 block, refused at start);
#                                                    # for issue 46:
#                                                    #   MULTI_TIME_LIMIT=520 timeout 560 bash benchmarks/scripts/gpu_run.sh
#                                                    #     OUT multi item1,qwen3next80b,ep
#                                                    #   MULTI_TIME_LIMIT=540 timeout 580 bash benchmarks/scripts/gpu_run.sh
#                                                    #     OUT multi step35flash   (repeat it if it lists not-run items)
#                                                    # (all by default; a part measured by an
#                                                    # earlier run into OUT_DIR is kept), or `single` on one GPU (the
#                                                    # TP = 1 and one-replica figures); JSON, PNG and log in OUT_DIR.
#                                                    # MULTI_TIME_LIMIT / MULTI_DP_RESERVE (seconds) set the run's
#                                                    # budget, MULTI_DP_STREAMS="64" the dp levels (bench multi
#                                                    # --dp-streams), MULTI_NO_ORACLE=1 leaves out the seed
#                                                    # models' ORACLE MTP items; a run into an OUT_DIR holding an earlier run's JSON
#                                                    # continues it (finished items are kept), so a bench longer than
#                                                    # one device command is the same command repeated
#   bash benchmarks/scripts/gpu_run.sh OUT_DIR train [minutes] [methods] # issue 22: the zoo's drafts retrained side by side
#                                                    # on the one GPU (methods of eagle3 dflash mtp, all by default;
#                                                    # `minutes` of training loop each, 7 by default (data and the
#                                                    # held-out run come on top: ~2 min on an H100); TRAIN_TIME_LIMIT
#                                                    # (s) stops a trainer, the rest still packed; TRAIN_WORK names
#                                                    # its scratch folder (one per run side by side on two GPUs);
#                                                    # TRAIN_RESUME=1 keeps that folder, so a run stopped by
#                                                    # TRAIN_TIME_LIMIT goes on from its saved state when the same
#                                                    # command is repeated on the same (still warm) machine;
#                                                    # TRAIN_SET="--set F=V ..." adds recipe fields to every run;
#                                                    # "--set total_minutes=9" bounds a whole run, data and held-out
#                                                    # run included, shortening the loop to fit): per method its
#                                                    # log, its draft as
#                                                    # draft_METHOD.tar.gz, and train_summary.json (held-out tau at
#                                                    # T=0 and T=1 as each trainer measured it, wall times)
#   bash benchmarks/scripts/gpu_run.sh OUT_DIR ablation [methods] # issue 22 item 4: benchmarks/scripts/train_ablation.py at its GPU
#                                                    # size, one process per method side by side (eagle3 dflash mtp
#                                                    # by default; resumable: repeat the command on the same machine
#                                                    # to go on; ABLATION_TIME_LIMIT seconds stops it); per method its
#                                                    # log, and the finished variants' merged JSON and tables
#   bash benchmarks/scripts/gpu_run.sh OUT_DIR closed_loop    # benchmarks/scripts/diag_closed_loop.py: one replica of the zoo widened
#                                                    # to 8B under a server's load of 64 streams, every step timed,
#                                                    # plain and adaptive EAGLE3, equal and spread lengths (~4 min)
#   bash benchmarks/scripts/gpu_run.sh OUT_DIR serve [methods] # outpace bench serve --sweep (issue 21): `outpace serve` of the
#                                                    # zoo widened to 8B for each method (of bench e2e's; none eagle3
#                                                    # by default; keep none for the speed-ups) at 1 to 64 concurrent
#                                                    # streams of a shared-prefix request mix; JSON, PNG, log and the
#                                                    # servers' logs in OUT_DIR
set -uo pipefail
out=${1:?output folder}
stage=${2:?checks, bench, e2e, multi, train, ablation, serve or closed_loop}
parts=${3:-abef}
mkdir -p "$out"
# Packages the device image lacks, carried as wheels in .whl/ (the device tool's README says how to fetch them).
# The server stages (serve, multi's dp parts) need, at constraints.txt's versions: fastapi, starlette, uvicorn,
# httptools, pydantic, pydantic_core, annotated-types, annotated-doc, typing-inspection, typing_extensions,
# anyio and opentelemetry-api (fastapi 0.165 imports it; without it every server exits at start, 2026-11-28).
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=.:/tmp/site
else
  export PYTHONPATH=.
fi
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
if [ "$stage" = checks ]; then
  python3 -m pytest -q -p no:cacheprovider tests/kernels/test_triton_attention.py tests/layers/test_fused_ops.py \
    tests/layers/test_fused_projection.py tests/layers/test_batch_invariant.py tests/layers/test_attention.py tests/engine/test_cuda_graphs.py \
    tests/gpu/test_gpu.py tests/speculative/test_adaptive.py 2>&1 | tee "$out/gpu_tests.log" | tail -8
  python3 -c "
from outpace.bench.attention import run_attention_bench
import json; json.dump(run_attention_bench(), open('$out/attention_bench.json', 'w'), indent=1)
" 2>&1 | tail -12
  { python3 -m outpace.bench.profile 8b 1 512
    for m in none eagle3 dflash; do python3 -m outpace.bench.profile zoo $m 1; python3 -m outpace.bench.profile zoo $m 8; done
  } 2>&1 | grep -v -i "warn" | tee "$out/profile.log" | grep -E "^context|^zoo|^one graph|Error"
  python3 -m outpace bench acceptance --device cuda --dtype bfloat16 --out "$out" 2>&1 | grep -v "it/s\]" | tail -8
elif [ "$stage" = multi ]; then
  # NVLink multicast off in NCCL, PyTorch and NVSHMEM, as the device notes ask
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
  python3 -m outpace bench multi --out "$out" --workdir .e2e_models ${3:+--parts "$3"} \
    ${MULTI_GPUS:+--gpus $MULTI_GPUS} ${MULTI_TIME_LIMIT:+--time-limit $MULTI_TIME_LIMIT} ${MULTI_DP_RESERVE:+--dp-reserve $MULTI_DP_RESERVE} \
    ${MULTI_DP_STREAMS:+--dp-streams $MULTI_DP_STREAMS} ${MULTI_NO_ORACLE:+--no-oracle} 2>&1 \
    | grep --line-buffered -v "it/s\]" | tee -a "$out/multi_gpu.log" | tail -80
elif [ "$stage" = serve ]; then
  shift 2
  python3 -m outpace bench serve --sweep --out "$out" --workdir .e2e_models --max-tokens 128 \
    --methods ${@:-none eagle3} 2>&1 | grep --line-buffered -v -E "it/s\]|tensor/s\]" | tee "$out/serve_sweep.log" \
    | tail -40
elif [ "$stage" = train ]; then
  minutes=${3:-7}
  shift $(( $# < 3 ? $# : 3 ))
  work=${TRAIN_WORK:-.e2e_models/train}  # (two runs side by side, one per GPU, name one each)
  [ -n "${TRAIN_RESUME:-}" ] || rm -rf "$work"
  mkdir -p "$work" && rm -f "$work/walls.txt"
  for m in ${@:-eagle3 dflash mtp}; do
    ( start=$(date +%s)
      timeout "${TRAIN_TIME_LIMIT:-0}" python3 -m outpace train draft --method "$m" --target zoo/tinypy \
        --out "$work/tinypy-$m" --device "${TRAIN_DEVICE:-cuda}" --max-minutes "$minutes" ${TRAIN_SET:-} \
        > "$out/train_$m.log" 2>&1
      echo "$m exit $? wall $(( $(date +%s) - start )) s" >> "$work/walls.txt" ) &
  done
  wait
  cat "$work/walls.txt"
  python3 - "$work" "$out/train_summary.json" <<'PY'
import json, sys
from pathlib import Path
work, rows = Path(sys.argv[1]), {}
walls = {l.split()[0]: l.strip() for l in (work / "walls.txt").read_text().splitlines()}
for d in sorted(work.glob("tinypy-*")):
    m = json.loads((d / "training_metrics.json").read_text()) if (d / "training_metrics.json").is_file() else {}
    held = m.get("heldout", {})
    rows[d.name] = {"run": walls.get(d.name.split("-", 1)[1]), "train_wall_seconds": m.get("train_wall_seconds"),
                    **{t: held[t].get("acceptance_length") for t in held if t.startswith("temperature")},
                    "acceptance_by_position_T0": held.get("temperature 0", {}).get("acceptance_rate_per_position")}
    print(d.name, rows[d.name])
Path(sys.argv[2]).write_text(json.dumps(rows, indent=1) + "\n")
PY
  for d in "$work"/tinypy-*; do  # (a run stopped by TRAIN_TIME_LIMIT leaves its training state, too big to return)
    tar -czf "$out/draft_${d##*-}.tar.gz" --exclude=resume -C "$work" "$(basename "$d")"; done
  ls -la "$out"
elif [ "$stage" = ablation ]; then
  shift 2
  methods=${@:-eagle3 dflash mtp}
  for m in $methods; do  # one process per method, side by side on the GPU; ABLATION_TIME_LIMIT (s) stops them
    timeout "${ABLATION_TIME_LIMIT:-0}" python3 benchmarks/scripts/train_ablation.py .e2e_models/ablation/$m --size gpu \
      --device cuda --methods $m 2>&1 | grep --line-buffered -v -E "it/s\]|s/it\]" > "$out/train_ablation_$m.log" &
  done
  wait
  python3 benchmarks/scripts/train_ablation.py "$out" --merge \
    $(for m in $methods; do [ -f .e2e_models/ablation/$m/train_ablation.json ] && echo .e2e_models/ablation/$m; done)
elif [ "$stage" = closed_loop ]; then
  # one replica's steps under a server's load (benchmarks/scripts/diag_closed_loop.py) on the zoo widened to 8B, plain and
  # adaptive EAGLE3, with equal and with spread output lengths
  python3 -c "from pathlib import Path; from outpace.bench.multi_gpu_plan import Plan, widened_zoo; \
widened_zoo(Plan(), Path('.e2e_models'))" 2>&1 | grep -v "tensor/s\]"
  for spread in 0 0.5; do
    for m in none eagle3; do
      python3 benchmarks/scripts/diag_closed_loop.py --model .e2e_models/tinypy --method $m \
        $([ $m = eagle3 ] && echo --draft .e2e_models/tinypy-eagle3) --device cuda --dtype bfloat16 --streams 64 \
        --requests 512 --max-tokens 128 --spread $spread --out "$out/closed_loop_${m}_spread$spread.json" 2>&1 \
        | grep -v -E "it/s\]|s/it\]|tensor/s\]" | tee -a "$out/closed_loop.log" | tail -12
    done
  done
elif [ "$stage" = e2e ]; then
  shift 2
  python3 -m outpace bench e2e --out "$out" --max-tokens 128 ${@:+--methods "$@"} 2>&1 | grep -v "it/s\]" | tail -50
else
  python3 -m outpace bench gpu --out "$out" --parts "$parts" 2>&1 | grep -v "it/s\]" | tail -30
fi
