"""The prompt text the shipped zoo EAGLE3 draft was trained on (zoo/tinypy-eagle3/README.md): the held-out
files of this machine's corpus (outpace/train/corpus.py), less every file that a prompt of
zoo/eval_prompts.json was cut from (``heldout_files_unused_by``), back to back, as one plain-text prompt
file for ``outpace train draft --data``. The evaluation prompts were cut from this machine's held-out
split, which depends on the packages installed here; the target trained on the GPU machine's train split.

    python benchmarks/scripts/heldout_prompt_text.py OUT.txt [FILES.json]   # FILES.json: the files used and excluded
"""

import json
import sys
from pathlib import Path

from outpace.train.corpus import build_corpus, heldout_files_unused_by

out = Path(sys.argv[1])
corpus = build_corpus(heldout_fraction=0.05, max_total_bytes=0)  # 0: no train file kept
prompts = json.loads(Path("zoo/eval_prompts.json").read_text())["prompts"]
files, excluded = heldout_files_unused_by(corpus, prompts, 30_000_000)
out.write_text("\n\n".join(f.text for f in files))
print(
    f"{len(files)} of {len(corpus.heldout)} held-out files ({len(excluded)} excluded), "
    f"{out.stat().st_size} bytes -> {out}"
)
if len(sys.argv) > 2:
    Path(sys.argv[2]).write_text(
        json.dumps({"files": [f.rel_path for f in files], "excluded": excluded}, indent=0)
    )
