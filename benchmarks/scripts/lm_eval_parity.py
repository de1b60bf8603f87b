"""A real client, lm-evaluation-harness, scores ``outpace serve`` the same with speculation on as with
``--method none`` (issue 42, build item 4).

For each ``--methods`` entry (the first is the reference) the script starts ``python -m outpace serve --model
zoo/tinypy --device cpu --method M`` on a free port, waits for /health, and runs ``lm_eval.simple_evaluate`` on
the two local tasks of ``benchmarks/scripts/lm_eval_tasks/`` (no download: data in .jsonl files beside them):

- ``local-completions`` (``/v1/completions``, prompts sent as token ids of zoo/tinypy's own tokenizer, 4 prompts
  per request, 2 requests in flight): ``outpace_code_choice`` (loglikelihood: echo + logprobs) and
  ``outpace_code_continue`` (generate_until, greedy, ``until: ["\\n\\n"]``, 32 tokens at most);
- ``local-chat-completions`` (``/v1/chat/completions``, zoo/tinypy's chat template applied by the server):
  ``outpace_code_continue``.

then reads the server's /metrics (drafts verified and accepted: proof that speculation ran) and stops it. It
compares every score and every sample (generated texts, each choice's log-likelihood and is-greedy flag) with
the reference's and writes ``results.json`` and ``README.md`` into ``--out``.

lm-eval is not a dependency of outpace: install it apart, e.g. in a virtual environment that sees the
project's packages, and run this script with that environment's Python from the repository root:

    python -m venv --system-site-packages /tmp/lmeval && /tmp/lmeval/bin/pip install "lm-eval[api]" -c constraints.txt
    /tmp/lmeval/bin/python benchmarks/scripts/lm_eval_parity.py --out benchmarks/results/lm_eval_parity

Exits 1 when a score or a sample differs from the reference's.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
# Everything is local: the tokenizer is read from the model's directory, the tasks' data from .jsonl files.
for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
    os.environ[var] = "1"

from outpace.bench.local_server import LocalServer  # noqa: E402

TASKS_DIR = ROOT / "benchmarks" / "scripts" / "lm_eval_tasks"
CHOICE, CONTINUE = "outpace_code_choice", "outpace_code_continue"
SPEC_COUNTERS = (
    "spec_decode_num_drafts_total",
    "spec_decode_num_draft_tokens_total",
    "spec_decode_num_accepted_tokens_total",
    "generation_tokens_total",
    "prompt_tokens_total",
)


def clients(url: str, model: str, name: str) -> list[dict]:
    """The lm-eval model configurations run against one server: client, model_args, tasks, batch size."""
    common = dict(model=name, num_concurrent=2, max_retries=1, timeout=600)
    return [
        dict(
            client="local-completions",
            tasks=[CHOICE, CONTINUE],
            batch_size=4,
            chat=False,
            model_args=dict(
                common,
                base_url=f"{url}/v1/completions",
                tokenizer=str(ROOT / model),
                tokenizer_backend="huggingface",
                tokenized_requests=True,
                max_length=2048,
            ),
        ),
        dict(
            client="local-chat-completions",
            tasks=[CONTINUE],
            batch_size=1,
            chat=True,
            model_args=dict(common, base_url=f"{url}/v1/chat/completions"),
        ),
    ]


def scrape_metrics(url: str) -> dict:
    """The server's Prometheus counters named in SPEC_COUNTERS, and its requests by finish reason."""
    import httpx

    out: dict = {"finished": {}}
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        key, value = line.rsplit(" ", 1)
        name = key.split("{", 1)[0].removeprefix("outpace:")
        if name in SPEC_COUNTERS:
            out[name.removesuffix("_total")] = int(float(value))
        elif name == "request_success_total":
            reason = re.search(r'finished_reason="([^"]*)"', key).group(1)
            out["finished"][reason] = int(float(value))
    return out


def sample_rows(samples: list[dict], output_type: str) -> list[dict]:
    """One compact row per document: its id and target, and what the server's answers made of it."""
    rows = []
    for s in sorted(samples, key=lambda s: s["doc_id"]):
        row = {"doc_id": s["doc_id"], "target": s["target"]}
        if output_type == "generate_until":
            row["text"] = s["resps"][0][0]
        else:  # one (loglikelihood, is_greedy) pair per choice
            row["loglikelihoods"] = [float(r[0][0]) for r in s["resps"]]
            row["is_greedy"] = [r[0][1] in (True, "True") for r in s["resps"]]
        row["scores"] = {m: s[m] for m in s.get("metrics", []) if m in s}
        rows.append(row)
    return rows


def run_method(method: str, model: str, served_name: str, limit: int | None, log_dir: Path) -> dict:
    import lm_eval
    from lm_eval.tasks import TaskManager

    log_path = log_dir / f"serve_{method}.log"
    server = LocalServer(
        "--model",
        model,
        "--device",
        "cpu",
        "--method",
        method,
        "--served-model-name",
        served_name,
        log_path=log_path,
    )
    out: dict = {
        "server_args": ["--model", model, "--device", "cpu", "--method", method],
        "runs": [],
    }
    try:
        t0 = time.monotonic()
        server.wait_ready(600)
        out["startup_s"] = round(time.monotonic() - t0, 1)
        serving = [ln for ln in server.output().splitlines() if "serving " in ln]
        out["server_says"] = serving[-1].split("outpace.server: ", 1)[-1] if serving else None
        task_manager = TaskManager(include_path=str(TASKS_DIR), include_defaults=False)
        for cfg in clients(server.url, model, served_name):
            t0 = time.monotonic()
            res = lm_eval.simple_evaluate(
                model=cfg["client"],
                model_args=cfg["model_args"],
                tasks=cfg["tasks"],
                batch_size=cfg["batch_size"],
                apply_chat_template=cfg["chat"],
                task_manager=task_manager,
                log_samples=True,
                limit=limit,
                random_seed=0,
                numpy_random_seed=1234,
                torch_random_seed=1234,
                fewshot_random_seed=1234,
                bootstrap_iters=0,
            )
            server.check_alive()
            run = {
                "client": cfg["client"],
                "batch_size": cfg["batch_size"],
                "model_args": {k: v for k, v in cfg["model_args"].items() if k != "base_url"},
                "apply_chat_template": cfg["chat"],
                "wall_s": round(time.monotonic() - t0, 1),
                "tasks": {},
            }
            for task in cfg["tasks"]:
                output_type = res["configs"][task]["output_type"]
                scores = {
                    k.split(",")[0]: v
                    for k, v in res["results"][task].items()
                    if "," in k and "_stderr" not in k
                }
                run["tasks"][task] = {
                    "output_type": output_type,
                    "n": len(res["samples"][task]),
                    "scores": scores,
                    "samples": sample_rows(res["samples"][task], output_type),
                }
            out["runs"].append(run)
        out["server_metrics"] = scrape_metrics(server.url)
    finally:
        out["server_exit"] = server.terminate()
    return out


def compare(ref: dict, other: dict) -> tuple[list[dict], list[dict]]:
    """Score rows (client, task, metric, both values, equal) and sample rows (per client and task: how many
    documents gave the same answers, and the largest log-likelihood difference)."""
    scores, samples = [], []
    for r_run, o_run in zip(ref["runs"], other["runs"], strict=True):
        for task, r_task in r_run["tasks"].items():
            o_task = o_run["tasks"][task]
            for metric, value in r_task["scores"].items():
                scores.append(
                    {
                        "client": r_run["client"],
                        "task": task,
                        "metric": metric,
                        "ref": value,
                        "other": o_task["scores"].get(metric),
                        "equal": bool(value == o_task["scores"].get(metric)),
                    }
                )
            same, max_diff, differing = 0, 0.0, []
            for r, o in zip(r_task["samples"], o_task["samples"], strict=True):
                if "text" in r:
                    ok = r["text"] == o["text"]
                else:
                    diffs = [
                        abs(a - b)
                        for a, b in zip(r["loglikelihoods"], o["loglikelihoods"], strict=True)
                    ]
                    max_diff = max([max_diff, *diffs])
                    ok = not any(diffs) and r["is_greedy"] == o["is_greedy"]
                same += ok
                if not ok:
                    differing.append(r["doc_id"])
            row = {
                "client": r_run["client"],
                "task": task,
                "documents": len(r_task["samples"]),
                "identical": same,
                "differing_doc_ids": differing,
            }
            if r_task["output_type"] != "generate_until":
                row["max_abs_loglikelihood_diff"] = max_diff
            samples.append(row)
    return scores, samples


def plain(o):
    """numpy scalars (lm-eval's scores) as Python numbers for json."""
    return o.item() if hasattr(o, "item") else str(o)


def fmt(v) -> str:
    v = plain(v) if hasattr(v, "item") else v
    if isinstance(v, float):
        return f"{v:.4f}" if not math.isnan(v) else "nan"
    return str(v)


def write_readme(out: Path, result: dict) -> None:
    methods = result["methods"]
    ref = methods[0]
    n_choice = len(result["runs"][ref]["runs"][0]["tasks"][CHOICE]["samples"])
    n_continue = len(result["runs"][ref]["runs"][0]["tasks"][CONTINUE]["samples"])
    lines = [
        "# lm-evaluation-harness against `outpace serve`: speculation on and off",
        "",
        "A real client, [lm-evaluation-harness](https://github.com/EleutherAI/lm-evaluation-harness) "
        f"{result['lm_eval_version']}, runs a loglikelihood task and a generate-until task against `outpace serve "
        f"--model {result['model']} --device cpu`, started once per method "
        f"({', '.join(f'`--method {m}`' for m in methods)}); every score and every document's answer is compared "
        f"with `--method {ref}`'s (issue 42, build item 4).",
        "",
        "- `local-completions` (`/v1/completions`) sends the prompts as token ids of zoo/tinypy's own tokenizer "
        "(`tokenizer=zoo/tinypy, tokenizer_backend=huggingface`), 4 prompts per request, 2 requests in flight "
        "(`batch_size=4, num_concurrent=2`); `max_retries=1`, so a refused request fails the run. Its loglikelihood "
        'request: `{"model", "prompt": [[ids], ...], "temperature": 0, "max_tokens": 1, "logprobs": 1, '
        '"seed": 1234, "echo": true}`, read from `choices[i].logprobs.token_logprobs` and `top_logprobs` (is '
        'greedy). Its generate request: `{"prompt": [[ids], ...], "model", "max_tokens": 32, '
        '"temperature": 0.0, "stop": ["\\n\\n"], "seed": 1234}`, read from `choices[i].text`.',
        "- `local-chat-completions` (`/v1/chat/completions`, `apply_chat_template=True`: one user message, the "
        'server applies zoo/tinypy\'s chat template) runs the generate-until task: `{"messages": [{"role": '
        '"user", ...}], "model", "max_tokens": 32, "temperature": 0.0, "stop": ["\\n\\n"], '
        '"seed": 1234}`. zoo/tinypy is a code model that was never trained on chats, so it scores 0 there '
        "under every method; the comparison that counts is of its texts, document by document.",
        "",
        "Greedy throughout. The loglikelihood requests generate one token, so they exercise the prefill path of a "
        "speculative server, not drafting; the generate-until requests draft (the drafts and "
        "accepted counters below).",
        "",
        "The tasks ([../../scripts/lm_eval_tasks/](../../scripts/lm_eval_tasks/)), hand-written Python snippets, no "
        "download:",
        "",
        f"- `{CHOICE}` (multiple choice, loglikelihood): {n_choice} Python prefixes, 4 continuations each, one "
        "right; `acc` and `acc_norm`.",
        f'- `{CONTINUE}` (generate_until, `until: ["\\n\\n"]`, `max_gen_toks: 32`): {n_continue} Python '
        "prefixes; `exact_match` of the generation's first line against the right continuation.",
        "",
        "## Command",
        "",
        "```",
        'python -m venv --system-site-packages /tmp/lmeval && /tmp/lmeval/bin/pip install "lm-eval[api]" -c constraints.txt',
        f"/tmp/lmeval/bin/python {result['command']}",
        "```",
        "",
        f"Machine: {result['machine']}. Date: {result['date']}. outpace commit {result['outpace_commit']}"
        + (
            f", with uncommitted changes to {', '.join(ln[3:] for ln in result['uncommitted_changes'])}."
            if result.get("uncommitted_changes")
            else " (outpace/ and zoo/ as committed)."
        ),
        "",
        "## Scores",
        "",
        f"| client | task | metric | {' | '.join(methods)} | equal? |",
        f"|---|---|---|{'---:|' * len(methods)}---|",
    ]
    for row in result["scores"]:
        values = [fmt(row["values"][m]) for m in methods]
        lines.append(
            f"| {row['client']} | {row['task']} | {row['metric']} | {' | '.join(values)} | "
            f"{'yes' if row['equal'] else '**no**'} |"
        )
    lines += [
        "",
        f"## Samples against `--method {ref}`",
        "",
        "Every document's answer: the generated text, or each choice's log-likelihood and is-greedy flag.",
        "",
        "| method | client | task | documents | identical | max abs log-likelihood difference |",
        "|---|---|---|---:|---:|---:|",
    ]
    for m, rows in result["samples_compared"].items():
        for row in rows:
            diff = row.get("max_abs_loglikelihood_diff")
            lines.append(
                f"| {m} | {row['client']} | {row['task']} | {row['documents']} | {row['identical']} | "
                f"{'-' if diff is None else f'{diff:.3g}'} |"
            )
    lines += [
        "",
        "## The servers",
        "",
        "Counters read from each server's /metrics after the runs (drafts: verify steps; accepted: draft "
        "tokens accepted) and its exit status after SIGTERM.",
        "",
        "| method | server says | drafts | draft tokens | accepted | generated tokens | prompt tokens | "
        "finished | exit |",
        "|---|---|---:|---:|---:|---:|---:|---|---:|",
    ]
    for m in methods:
        run = result["runs"][m]
        sm = run["server_metrics"]
        finished = ", ".join(f"{k} {v}" for k, v in sorted(sm["finished"].items()))
        lines.append(
            f"| {m} | {run['server_says']} | {sm.get('spec_decode_num_drafts', 0)} | "
            f"{sm.get('spec_decode_num_draft_tokens', 0)} | {sm.get('spec_decode_num_accepted_tokens', 0)} | "
            f"{sm.get('generation_tokens', 0)} | {sm.get('prompt_tokens', 0)} | {finished} | "
            f"{run['server_exit']} |"
        )
    verdict = "equal" if result["all_equal"] else "NOT equal"
    lines += [
        "",
        f"Verdict: every score and every sample {verdict} to `--method {ref}`'s.",
        "",
        "results.json holds all of it, with each document's answer under each method.",
        "",
    ]
    (out / "README.md").write_text("\n".join(lines))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "lm_eval_parity"))
    p.add_argument("--model", default="zoo/tinypy")
    p.add_argument("--served-model-name", default="tinypy")
    p.add_argument(
        "--methods",
        nargs="+",
        default=["none", "eagle3"],
        help="server --method values; the first is the reference",
    )
    p.add_argument("--limit", type=int, default=None, help="documents per task (all by default)")
    p.add_argument(
        "--log-dir", default="/tmp", help="where the servers' logs go (serve_METHOD.log)"
    )
    args = p.parse_args()
    os.chdir(ROOT)  # the tasks' data_files are relative to the repository root

    import lm_eval

    out, log_dir = Path(args.out), Path(args.log_dir)
    out.mkdir(parents=True, exist_ok=True)
    log_dir.mkdir(parents=True, exist_ok=True)
    runs = {}
    for method in args.methods:
        print(f"== --method {method}", flush=True)
        runs[method] = run_method(method, args.model, args.served_model_name, args.limit, log_dir)
    ref = args.methods[0]
    scores: dict[tuple, dict] = {}
    samples_compared = {}
    for method in args.methods[1:]:
        rows, sample_rows_ = compare(runs[ref], runs[method])
        samples_compared[method] = sample_rows_
        for row in rows:
            key = (row["client"], row["task"], row["metric"])
            entry = scores.setdefault(
                key,
                {
                    "client": row["client"],
                    "task": row["task"],
                    "metric": row["metric"],
                    "values": {ref: row["ref"]},
                    "equal": True,
                },
            )
            entry["values"][method] = row["other"]
            entry["equal"] &= row["equal"]
    all_equal = all(s["equal"] for s in scores.values()) and all(
        row["identical"] == row["documents"] for rows in samples_compared.values() for row in rows
    )
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    # uncommitted changes to the code the servers ran (others may be editing this working tree)
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--", "outpace", "zoo"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    ).stdout.split("\n")
    dirty = [ln for ln in dirty if ln.strip()]
    cpu = next(
        (
            ln.split(":", 1)[1].strip()
            for ln in Path("/proc/cpuinfo").read_text().splitlines()
            if ln.startswith("model name")
        ),
        platform.processor(),
    )
    command = "benchmarks/scripts/lm_eval_parity.py" + "".join(f" {a}" for a in sys.argv[1:])
    result = {
        "what": "lm-evaluation-harness scores of outpace serve, speculation on against --method none",
        "command": command,
        "machine": f"this CPU container ({os.cpu_count()} cores of an {cpu}, shared; fp32 on the CPU)",
        "date": datetime.date.today().isoformat(),
        "outpace_commit": commit,
        "uncommitted_changes": dirty,
        "lm_eval_version": lm_eval.__version__ if hasattr(lm_eval, "__version__") else "",
        "model": args.model,
        "methods": args.methods,
        "all_equal": all_equal,
        "scores": list(scores.values()),
        "samples_compared": samples_compared,
        "runs": runs,
    }
    (out / "results.json").write_text(json.dumps(result, indent=1, default=plain) + "\n")
    write_readme(out, result)
    for s in scores.values():
        print(
            s["client"], s["task"], s["metric"], s["values"], "equal" if s["equal"] else "DIFFERENT"
        )
    for m, rows in samples_compared.items():
        for row in rows:
            print(m, row)
    print("all equal" if all_equal else "NOT all equal", flush=True)
    return 0 if all_equal else 1


if __name__ == "__main__":
    sys.exit(main())
