"""Every runnable code block of README.md and of the docs pages runs, on a CPU and offline.

A block is a fenced block whose language is ``bash`` or ``python``; one test per block, with ids such as
``README.md:3`` or ``guide/interop.md:4`` (the page and the block's number among its runnable blocks).
Output and pictures use ``text`` / ``mermaid`` fences and are not run; an indented code block is refused,
because it would escape this test. A block that cannot run here carries a visible marker on the line
before its fence, which the test reports as a skip or an expected failure with its reason:

    <!-- not-tested: needs a GPU -->          skipped (a GPU, torchrun on several GPUs, the network, ...)
    <!-- known-failure: what lsr lacks -->    must fail (strict xfail): remove the marker once lsr is fixed

Each page runs in its own scratch folder, never in the repository: ``configs`` links to the repository's,
``data/`` holds links to the repository's data except ``data/scifact``, a slice of SciFact (its first test
and train queries with their judged abstracts and some more) so that the pages' SciFact jobs take seconds,
not minutes. A page's blocks run in page order in that folder, bash blocks with ``bash -euo pipefail``,
Python blocks in one interpreter per page (tests/docs/python_blocks.py), so a block may use the files and
names of the page's earlier blocks, as a reader going down the page would. A test selected alone (or given
to another xdist worker) first runs the page's earlier blocks. ``lsr`` and ``python`` are the interpreter
running the tests, with this checkout first on PYTHONPATH; Hugging Face libraries are offline and HTTP(S)
goes to a closed local port, so a block that needs the network fails instead of downloading.
"""

from __future__ import annotations

import json
import os
import re
import select
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow   # builds the site / runs every documented command

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
DATA = REPO / "data"
PAGES = [REPO / "README.md", *sorted(DOCS.rglob("*.md"))]
RUNNABLE = {"bash": "bash", "sh": "bash", "shell": "bash", "python": "python", "py": "python"}
NOT_COMMANDS = {"text", "mermaid", "yaml", "json", "toml"}
FENCE = re.compile(r"^ {0,3}(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`]*)$")
MARKER = re.compile(r"^<!--\s*(?P<kind>not-tested|known-failure):\s*(?P<reason>\S.*?)\s*-->$")
BLOCK_TIMEOUT_S = 600
# the scifact slice: enough judged test queries for metrics and train queries for the docs' two-step training
SLICE_QUERIES = {"test": 8, "train": 20}
SLICE_OTHER_DOCS = 40
# what a documented command must not print to its user (torch's notices, not lsr's)
UNWANTED_OUTPUT = ("Sparse CSR tensor support is in beta",)


@dataclass(frozen=True)
class Fence:
    page: str            # "README.md" or the path under docs/
    line: int            # 1-based line of the opening fence
    language: str
    code: str
    marker: tuple[str, str] | None = None   # (kind, reason) from the comment before the fence
    number: int = 0      # 1-based among the page's runnable blocks (0: not a command)

    @property
    def id(self) -> str:
        return f"{self.page}:{self.number}"


def page_name(path: Path) -> str:
    return path.name if path.parent == REPO else path.relative_to(DOCS).as_posix()


def read_fences(path: Path) -> list[Fence]:
    """The page's fenced blocks in order, with the marker on the last non-blank line before each."""
    lines = path.read_text(encoding="utf-8").splitlines()
    fences: list[Fence] = []
    i, number = 0, 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        fence, info = opening.group("fence"), opening.group("info").strip()
        end = next((j for j in range(i + 1, len(lines))
                    if lines[j].strip().startswith(fence[0] * len(fence)) and not lines[j].strip(fence[0]).strip()),
                   len(lines))
        before = next((ln.strip() for ln in reversed(lines[:i]) if ln.strip()), "")
        marker = MARKER.match(before)
        language = info.split()[0].lower() if info else ""
        number += language in RUNNABLE
        fences.append(Fence(page_name(path), i + 1, language, "\n".join(lines[i + 1:end]) + "\n",
                            (marker.group("kind"), marker.group("reason")) if marker else None,
                            number if language in RUNNABLE else 0))
        i = end + 1
    return fences


ALL_FENCES = [fence for page in PAGES for fence in read_fences(page)]
BLOCKS = [fence for fence in ALL_FENCES if fence.number]


def block_param(block: Fence) -> pytest.param:
    # a page repeating another's block word for word (the README's quickstart, say) runs it once
    first = next(b for b in BLOCKS if b.code == block.code)
    marks = []
    if block.marker and block.marker[0] == "not-tested":
        marks.append(pytest.mark.skip(reason=f"not tested: {block.marker[1]}"))
    elif first is not block and not first.marker:
        marks.append(pytest.mark.skip(reason=f"the same code as {first.id}, which runs"))
    elif block.marker:
        marks.append(pytest.mark.xfail(reason=f"known failure: {block.marker[1]}", strict=True))
    return pytest.param(block, id=block.id, marks=marks)


# ------------------------------------------------------------------------------------------ the scratch data
def write_scifact_slice(folder: Path) -> None:
    """A BEIR folder with SciFact's first test and train queries, their judged abstracts and
    ``SLICE_OTHER_DOCS`` more, in the original order."""
    source = DATA / "scifact"
    qids: set[str] = set()
    judged: set[str] = set()
    (folder / "qrels").mkdir(parents=True)
    for split, n_queries in SLICE_QUERIES.items():
        header, *rows = (source / "qrels" / f"{split}.tsv").read_text(encoding="utf-8").splitlines()
        first = set(list(dict.fromkeys(r.split("\t")[0] for r in rows))[:n_queries])
        kept = [r for r in rows if r.split("\t")[0] in first]
        (folder / "qrels" / f"{split}.tsv").write_text("\n".join([header, *kept]) + "\n", encoding="utf-8")
        qids |= first
        judged |= {r.split("\t")[1] for r in kept}
    others = SLICE_OTHER_DOCS
    docs = []
    for line in (source / "corpus.jsonl").read_text(encoding="utf-8").splitlines():
        if json.loads(line)["_id"] in judged or (others := others - 1) >= 0:
            docs.append(line)
    queries = [ln for ln in (source / "queries.jsonl").read_text(encoding="utf-8").splitlines()
               if json.loads(ln)["_id"] in qids]
    (folder / "corpus.jsonl").write_text("\n".join(docs) + "\n", encoding="utf-8")
    (folder / "queries.jsonl").write_text("\n".join(queries) + "\n", encoding="utf-8")


@pytest.fixture(scope="module")
def scratch_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """data/ (links + the SciFact slice) and bin/ (``lsr`` and ``python`` of this interpreter), shared."""
    base = tmp_path_factory.mktemp("docs-blocks")
    (base / "data").mkdir()
    for entry in DATA.iterdir():
        if entry.name != "scifact":
            (base / "data" / entry.name).symlink_to(entry)
    write_scifact_slice(base / "data" / "scifact")
    (base / "bin").mkdir()
    for name, args in {"lsr": "-m lsr", "python": "", "python3": ""}.items():
        shim = base / "bin" / name
        shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" {args} "$@"\n')
        shim.chmod(0o755)
    return base


def block_env(base: Path, page_root: Path) -> dict[str, str]:
    closed_port = "http://127.0.0.1:9"  # the discard port: nothing listens, any download fails at once
    python_path = os.pathsep.join(p for p in [str(REPO), os.environ.get("PYTHONPATH", "")] if p)
    return dict(os.environ, PATH=f"{base / 'bin'}{os.pathsep}{os.environ['PATH']}", PYTHONPATH=python_path,
                HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                HTTP_PROXY=closed_port, HTTPS_PROXY=closed_port, http_proxy=closed_port, https_proxy=closed_port,
                NO_PROXY="localhost,127.0.0.1", no_proxy="localhost,127.0.0.1",
                IR_DATASETS_HOME=str(page_root / "ir_datasets"), MPLBACKEND="Agg")


def repository_listing() -> set[str]:
    """What a block writing into the repository (by a wrong cwd or through a data link) would change."""
    names = {p.name for p in REPO.iterdir()}
    return names | {str(p.relative_to(REPO)) for top in ("data", "configs") for p in (REPO / top).rglob("*")}


# ------------------------------------------------------------------------------------------ one page's run
@dataclass
class PageRun:
    """A page's scratch folder, its Python interpreter and which of its blocks ran (failure text or None)."""

    root: Path
    env: dict[str, str]
    python: subprocess.Popen | None = None
    ran: dict[int, str | None] = field(default_factory=dict)

    @property
    def work(self) -> Path:
        return self.root / "work"

    def run(self, block: Fence) -> str | None:
        """Run one block in the page's folder; returns a failure description, None when it passed."""
        before = repository_listing()
        failure, output = self.run_bash(block) if RUNNABLE[block.language] == "bash" else self.run_python(block)
        unwanted = [text for text in UNWANTED_OUTPUT if text in output]
        if unwanted and not failure:
            failure = f"it printed {unwanted}; output:\n{output}"
        written = sorted(repository_listing() - before)
        if written:
            failure = (failure or "") + f"\nthe block wrote into the repository: {written[:10]}"
        self.ran[block.number] = failure
        return failure

    def run_bash(self, block: Fence) -> tuple[str | None, str]:
        """(failure description or None, what the block printed)"""
        try:
            proc = subprocess.run(["bash", "-euo", "pipefail", "-c", block.code], cwd=self.work, env=self.env,
                                  capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S)
        except subprocess.TimeoutExpired as exc:
            output = f"{exc.stdout or ''}{exc.stderr or ''}"
            return f"timed out after {BLOCK_TIMEOUT_S} s; output:\n{output}", output
        output = proc.stdout + proc.stderr
        return (None if proc.returncode == 0 else f"exit status {proc.returncode}; output:\n{output}"), output

    def run_python(self, block: Fence) -> tuple[str | None, str]:
        if self.python is None:
            self.python = subprocess.Popen([sys.executable, str(Path(__file__).with_name("python_blocks.py"))],
                                           cwd=self.work, env=self.env, stdin=subprocess.PIPE,
                                           stdout=subprocess.PIPE, text=True)
        path = self.root / "blocks" / f"block-{block.number}.py"
        path.parent.mkdir(exist_ok=True)
        path.write_text(block.code, encoding="utf-8")
        self.python.stdin.write(f"{path}\n")
        self.python.stdin.flush()
        ready, _, _ = select.select([self.python.stdout], [], [], BLOCK_TIMEOUT_S)
        status = self.python.stdout.readline().strip() if ready else "timeout"
        log = Path(f"{path}.log").read_text(encoding="utf-8") if Path(f"{path}.log").exists() else ""
        if status == "ok":
            return None, log
        if status != "error":  # timed out or died: the page's later Python blocks start a fresh interpreter
            self.close()
            status = f"timed out after {BLOCK_TIMEOUT_S} s" if status == "timeout" else "the interpreter died"
        return f"{status}; output:\n{log}", log

    def close(self) -> None:
        if self.python is not None:
            self.python.kill()
            self.python.wait()
            self.python = None


@pytest.fixture(scope="module")
def page_runs(scratch_base: Path):
    runs: dict[str, PageRun] = {}

    def page_run(page: str) -> PageRun:
        if page not in runs:
            root = scratch_base / "pages" / page.replace("/", "-").removesuffix(".md")
            (root / "work").mkdir(parents=True)
            (root / "work" / "data").symlink_to(scratch_base / "data")
            (root / "work" / "configs").symlink_to(REPO / "configs")
            runs[page] = PageRun(root, block_env(scratch_base, root))
        return runs[page]

    yield page_run
    for run in runs.values():
        run.close()


@pytest.mark.parametrize("block", [block_param(b) for b in BLOCKS])
def test_code_block_runs(block: Fence, page_runs) -> None:
    run = page_runs(block.page)
    earlier = [b for b in BLOCKS if b.page == block.page and b.number < block.number
               and not (b.marker and b.marker[0] == "not-tested")]
    for previous in earlier:
        if previous.number not in run.ran:
            run.run(previous)
    failure = run.run(block)
    if failure:
        broken = [f"{block.page}:{n}" for n, text in sorted(run.ran.items()) if text and n < block.number]
        note = f" (earlier blocks of the page that failed: {', '.join(broken)})" if broken else ""
        pytest.fail(f"{block.id}, the block at line {block.line}{note}, {failure[-4000:]}\n--- the block:\n"
                    f"{block.code}", pytrace=False)


# ------------------------------------------------------------------------------------------ the inventory
def test_every_fence_says_what_it_is() -> None:
    # A fence without a language, or one this test does not know, would silently escape it.
    unknown = [f"{f.page} line {f.line}: ```{f.language}" for f in ALL_FENCES
               if f.language not in RUNNABLE and f.language not in NOT_COMMANDS]
    assert not unknown, f"use bash or python for commands and text for output: {unknown}"
    stray = [f"{f.page} line {f.line}" for f in ALL_FENCES if f.marker and not f.number]
    assert not stray, f"a not-tested / known-failure marker before a fence that is not a command: {stray}"


def test_no_indented_code_block() -> None:
    markdown = pytest.importorskip("markdown", reason='the docs extra is not installed: pip install -e ".[docs]"')
    found = []
    for page in PAGES:
        lines = page.read_text(encoding="utf-8").splitlines()
        for fence in read_fences(page):  # blank out the fenced blocks: what remains must hold no code block
            end = fence.line + fence.code.count("\n")
            lines[fence.line - 1:end + 1] = [""] * (end + 2 - fence.line)
        html = markdown.markdown("\n".join(lines), extensions=["tables", "admonition", "attr_list", "md_in_html",
                                                                "pymdownx.details"])
        found += [f"{page_name(page)}: {code.strip().splitlines()[0][:60]!r}"
                  for code in re.findall(r"<pre><code>(.*?)</code></pre>", html, re.DOTALL)]
    assert not found, f"indented code blocks escape the block tests; fence them as bash, python or text: {found}"


def test_the_markers_name_a_reason_and_most_blocks_run() -> None:
    skipped = [b for b in BLOCKS if b.marker and b.marker[0] == "not-tested"]
    assert all(len(b.marker[1].split()) >= 3 for b in BLOCKS if b.marker), "say why in a few words"
    assert len(skipped) < len(BLOCKS), "every block is skipped"
    for page in ("README.md", "getting-started.md"):
        assert any(b.page == page and not b.marker for b in BLOCKS), f"{page} has no tested block"
