"""A corpus of Python source files found on this machine (stdlib + site-packages).

The corpus is deterministic: files are visited root by root in sorted relative-path
order, duplicates are dropped by content hash (first occurrence wins), and the
train/held-out split depends only on each file's relative path through sha256, so
`json/decoder.py` lands on the same side on every machine and Python version.
"""

from __future__ import annotations

import hashlib
import os
import random
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

# Directory names never descended into.
_SKIP_DIR_NAMES = frozenset({"__pycache__", ".git", ".hg", ".svn", ".tox", ".venv", "node_modules"})

# This package's own directory, and the repository holding it when run from a checkout:
# we must never train (or evaluate) on our own source.
_PACKAGE_DIR = Path(__file__).resolve().parents[1]
_REPO_DIR = _PACKAGE_DIR.parent if (_PACKAGE_DIR.parent / "pyproject.toml").exists() else None


@dataclass(frozen=True)
class SourceFile:
    """One source file. rel_path is relative to the root it was found under, '/'-separated."""

    rel_path: str
    text: str


@dataclass
class Corpus:
    """Train and held-out source files, each list sorted by rel_path; no file is in both."""

    train: list[SourceFile]
    heldout: list[SourceFile]

    def stats(self) -> dict[str, int]:
        """Number of files and UTF-8 bytes per split."""
        return {
            "train_files": len(self.train),
            "train_bytes": sum(len(f.text.encode("utf-8")) for f in self.train),
            "heldout_files": len(self.heldout),
            "heldout_bytes": sum(len(f.text.encode("utf-8")) for f in self.heldout),
        }


def default_roots() -> list[Path]:
    """The interpreter's stdlib and site-packages directories (deduplicated, existing only)."""
    paths = sysconfig.get_paths()
    roots: list[Path] = []
    for key in ("stdlib", "purelib", "platlib"):
        value = paths.get(key)
        if not value:
            continue
        root = Path(value).resolve()
        if root.is_dir() and root not in roots:
            roots.append(root)
    return roots


def is_heldout(rel_path: str, heldout_fraction: float) -> bool:
    """Whether rel_path belongs to the held-out split.

    NOTE: uses sha256 of the '/'-separated relative path, never Python's salted hash(),
    so the decision is identical across machines, processes and Python versions.
    """
    if not 0.0 <= heldout_fraction <= 1.0:
        raise ValueError(f"heldout_fraction must be in [0, 1], got {heldout_fraction}")
    digest = hashlib.sha256(rel_path.encode("utf-8")).digest()
    # First 8 bytes as a uniform number in [0, 1).
    u = int.from_bytes(digest[:8], "big") / 2**64
    return u < heldout_fraction


def _is_own_path(rel_path: str) -> bool:
    """Installed copies of outpace (site-packages/outpace, its dist-info, editable finders)."""
    top = rel_path.split("/", 1)[0].lower()
    return top == "outpace" or top.startswith(("outpace-", "__editable___outpace"))


def _walk_python_files(root: Path, excluded_dirs: set[Path]) -> Iterator[tuple[str, Path]]:
    """Yield (rel_path, path) for every *.py file under root, in sorted rel_path order.

    Directories in excluded_dirs (other roots nested in this one, e.g. site-packages
    inside the stdlib, and our own source tree) are not descended into.
    """
    found: list[tuple[str, Path]] = []
    for dirpath, dirnames, filenames in os.walk(root):
        current = Path(dirpath)
        keep = []
        for name in dirnames:
            if name in _SKIP_DIR_NAMES or name.startswith("."):
                continue
            if (current / name).resolve() in excluded_dirs:
                continue
            keep.append(name)
        dirnames[:] = keep  # prune in place so os.walk does not descend
        for name in filenames:
            if name.endswith(".py"):
                path = current / name
                found.append((path.relative_to(root).as_posix(), path))
    # NOTE: sort by the '/'-joined path, not walk order, so the order (and so dedup and
    # max_total_bytes decisions) is the same on every file system.
    found.sort(key=lambda item: item[0])
    return iter(found)


def _read_source(path: Path, min_bytes: int, max_bytes: int) -> str | None:
    """The file's text, or None when unreadable, not UTF-8, or outside the size bounds."""
    try:
        size = path.stat().st_size
        if size < min_bytes or size > max_bytes:
            return None
        return path.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def build_corpus(
    roots: Iterable[Path | str] | None = None,
    heldout_fraction: float = 0.05,
    max_file_bytes: int = 200_000,
    min_file_bytes: int = 200,
    max_total_bytes: int | None = None,
) -> Corpus:
    """Collect *.py files under roots (default: default_roots()) and split them.

    Files are visited root by root, each root in sorted rel_path order. A file is kept
    when it is readable UTF-8 of min_file_bytes..max_file_bytes bytes, is not part of
    outpace itself, and neither its content (sha256) nor its rel_path was seen before:
    the first occurrence wins. max_total_bytes caps the train split: once its UTF-8 size
    reaches the cap, no further train files are added; the held-out split is unaffected.
    """
    if min_file_bytes > max_file_bytes:
        raise ValueError(f"min_file_bytes {min_file_bytes} > max_file_bytes {max_file_bytes}")
    root_list = [Path(r).resolve() for r in (default_roots() if roots is None else roots)]
    for root in root_list:
        if not root.is_dir():
            raise FileNotFoundError(f"corpus root is not a directory: {root}")

    own_dirs = {_PACKAGE_DIR} | ({_REPO_DIR} if _REPO_DIR is not None else set())
    seen_hashes: set[bytes] = set()
    seen_paths: set[str] = set()
    train: list[SourceFile] = []
    heldout: list[SourceFile] = []
    train_bytes = 0
    for root in root_list:
        excluded = own_dirs | {r for r in root_list if r != root}
        if root in own_dirs:
            continue
        for rel_path, path in _walk_python_files(root, excluded):
            if rel_path in seen_paths or _is_own_path(rel_path):
                continue
            text = _read_source(path, min_file_bytes, max_file_bytes)
            if text is None:
                continue
            data = text.encode("utf-8")
            digest = hashlib.sha256(data).digest()
            if digest in seen_hashes:
                continue
            # NOTE: files past the train cap are still hashed and recorded, so the
            # held-out split is the same with or without max_total_bytes.
            seen_hashes.add(digest)
            seen_paths.add(rel_path)
            if is_heldout(rel_path, heldout_fraction):
                heldout.append(SourceFile(rel_path, text))
            elif max_total_bytes is None or train_bytes < max_total_bytes:
                train.append(SourceFile(rel_path, text))
                train_bytes += len(data)
    train.sort(key=lambda f: f.rel_path)
    heldout.sort(key=lambda f: f.rel_path)
    return Corpus(train=train, heldout=heldout)


def _snippet(text: str, prompt_chars: int, rng: random.Random) -> str:
    """A run of whole lines starting at a line start, at most about prompt_chars long.

    Starts preferably at a top-level `def ` / `class ` line with enough text after it;
    the snippet ends at the end of a line, without the trailing newline: the BPE merges a newline
    with the next line's indentation, so a prompt ending in a lone newline token is out of
    distribution (token healing).
    """
    # NOTE: split on "\n" only; str.splitlines would also break at form feeds etc.
    parts = text.split("\n")
    lines = [part + "\n" for part in parts[:-1]] + ([parts[-1]] if parts[-1] else [])
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))
    total = offsets[-1]

    def fits(i: int) -> bool:
        return total - offsets[i] >= prompt_chars

    nonblank = [i for i, line in enumerate(lines) if line.strip()]
    defs = [i for i in nonblank if lines[i].startswith(("def ", "class "))]
    for pool in ([i for i in defs if fits(i)], [i for i in nonblank if fits(i)], defs, nonblank):
        if pool:
            start = rng.choice(pool)
            break
    else:
        return ""
    end = start + 1  # always at least one line
    while end < len(lines) and offsets[end + 1] - offsets[start] <= prompt_chars:
        end += 1
    return text[offsets[start] : offsets[end]].rstrip("\n")


def heldout_prompts(
    corpus: Corpus, num_prompts: int, prompt_chars: int = 512, seed: int = 0
) -> list[str]:
    """Deterministic evaluation prompts cut from held-out files only.

    Files are drawn with random.Random(seed) without replacement (cycling through a fresh
    shuffle if num_prompts exceeds the number of held-out files); each prompt is a
    line-aligned snippet of about prompt_chars characters (see _snippet).
    """
    if num_prompts < 0 or prompt_chars <= 0:
        raise ValueError(
            f"need num_prompts >= 0 and prompt_chars > 0, got {num_prompts}, {prompt_chars}"
        )
    if num_prompts and not corpus.heldout:
        raise ValueError("corpus has no held-out files to cut prompts from")
    rng = random.Random(seed)
    prompts: list[str] = []
    order: list[SourceFile] = []
    attempts = 0
    while len(prompts) < num_prompts:
        if not order:
            order = list(corpus.heldout)
            rng.shuffle(order)
        snippet = _snippet(order.pop().text, prompt_chars, rng)
        attempts += 1
        if snippet.strip():
            prompts.append(snippet)
        elif attempts > 10 * (num_prompts + len(corpus.heldout)):
            raise ValueError("held-out files contain no usable text for prompts")
    return prompts


# A prompt found in no file is matched by its longest lines instead: up to this many distinct lines of at least
# this many characters (stripped); shorter lines ("return x", "else:") are too common to tell files apart.
_MATCH_LINES = 3
_MATCH_LINE_CHARS = 24


def _identifying_lines(prompt: str) -> list[str]:
    """The prompt's longest distinct stripped lines (at most _MATCH_LINES, each >= _MATCH_LINE_CHARS long)."""
    lines = {line.strip() for line in prompt.split("\n")}
    long = sorted(
        (line for line in lines if len(line) >= _MATCH_LINE_CHARS),
        key=lambda line: (-len(line), line),
    )
    return long[:_MATCH_LINES]


def files_holding_prompts(files: list[SourceFile], prompts: list[str]) -> set[str]:
    """rel_paths of the files that any of ``prompts`` (e.g. heldout_prompts' output) was cut from.

    A prompt, stripped of its surrounding whitespace, marks every file whose text holds it: _snippet cuts a
    run of whole lines out of the file, so it is a substring of that file's text wherever the file is the same.
    The corpus depends on the installed packages, so the file may differ here (another version of its
    package); a prompt that no file holds marks instead every file holding most of its _identifying_lines (a
    majority, each line stripped). A file that is not in ``files`` at all (its package missing, or its path on
    the train side here) matches nothing, as it should.
    """
    marked: set[str] = set()
    for prompt in filter(None, (p.strip() for p in prompts)):
        exact = {f.rel_path for f in files if prompt in f.text}
        if not exact:
            lines = _identifying_lines(prompt)
            need = len(lines) // 2 + 1
            exact = {
                f.rel_path for f in files if lines and sum(line in f.text for line in lines) >= need
            }
        marked |= exact
    return marked


def heldout_files_unused_by(
    corpus: Corpus, eval_prompts: list[str], max_total_bytes: int | None = None
) -> tuple[list[SourceFile], list[str]]:
    """(files, excluded): the held-out files that no prompt of ``eval_prompts`` was cut from
    (files_holding_prompts), in rel_path order, and the sorted rel_paths of those excluded.

    max_total_bytes caps the files kept as build_corpus caps the train split: once their UTF-8 size reaches
    the cap, no further file is added.
    """
    excluded = files_holding_prompts(corpus.heldout, eval_prompts)
    files: list[SourceFile] = []
    size = 0
    for f in corpus.heldout:
        if max_total_bytes is not None and size >= max_total_bytes:
            break
        if f.rel_path in excluded:
            continue
        files.append(f)
        size += len(f.text.encode("utf-8"))
    return files, sorted(excluded)
