"""The documentation site builds with ``mkdocs build --strict`` and says what the package and the results are.

The build reads the docstrings statically (mkdocstrings + griffe), so it needs no GPU and imports nothing of
lsr; it fetches nothing either (no social cards, no web fonts), so it runs on a CPU-only machine offline, and the
built pages load nothing from the network when they are viewed.
"""

from __future__ import annotations

import ast
import itertools
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow   # builds the site / runs every documented command

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"

# The public names of lsr.__all__ and one stage package each: the reference must render all of them.
PUBLIC = ["SparseVectors", "InvertedIndex", "Searcher", "SpladeEncoder", "LexicalEncoder", "evaluate", "load_dataset"]
STAGE_PAGES = ["sparse", "config", "data", "storage", "encode-splade", "encode-bm25", "encode-sparton", "index-package",
               "search", "live", "evaluation", "train", "serve", "rerank", "parallel", "interop"]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    for module in ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python"):
        pytest.importorskip(module, reason='the docs extra is not installed: pip install -e ".[docs]"')
    out = tmp_path_factory.mktemp("site")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout}\n{proc.stderr}"
    return out


@pytest.mark.slow
def test_every_page_of_the_nav_is_built(site: Path) -> None:
    for page in ["index.html", "getting-started/index.html", "architecture/index.html", "contributing/index.html",
                 "guide/search/index.html", "performance/search/index.html", "performance/head/index.html"]:
        assert (site / page).is_file(), page


def test_the_reference_renders_the_public_api_and_each_stage_package(site: Path) -> None:
    root = (site / "reference" / "index.html").read_text(encoding="utf-8")
    for name in PUBLIC:
        assert f'id="lsr.{name}"' in root, f"lsr.{name} is missing from the reference"
    for page in STAGE_PAGES:
        html = (site / "reference" / page / "index.html").read_text(encoding="utf-8")
        # the package heading plus at least one documented member below it
        assert len(re.findall(r'class="doc doc-heading"', html)) >= 2, f"reference/{page} renders no member"


# a tag that makes the browser fetch from another host: <script src>, <link href> (stylesheets, fonts, icons), <img src>
EXTERNAL_LOAD = re.compile(r"<(?:script|link|img|iframe)\b[^>]*\b(?:src|href)=[\"']?(?:https?:)?//[^\"'\s>]+", re.IGNORECASE)


def test_the_built_pages_load_nothing_from_the_network(site: Path) -> None:
    """Offline, a page shows all it has: no script, stylesheet or font from another host, and no Mermaid diagram
    (Material's bundle fetches mermaid.js from a CDN for an element of class "mermaid"; a fence it did not render
    would show its source)."""
    pages = sorted(site.rglob("*.html"))
    assert len(pages) > 20
    problems = []
    for page in pages:
        html = page.read_text(encoding="utf-8")
        name = page.relative_to(site).as_posix()
        problems += [f"{name}: {m.group(0)}" for m in EXTERNAL_LOAD.finditer(html)]
        if re.search(r'class="[^"]*\b(?:language-)?mermaid\b', html):
            problems.append(f"{name}: a Mermaid block")
    for css in site.rglob("*.css"):
        problems += [f"{css.relative_to(site)}: {m.group(0)}"
                     for m in re.finditer(r"@import\s+url\([\"']?(?:https?:)?//[^)]*\)", css.read_text(encoding="utf-8"))]
    assert not problems, "\n".join(problems)


def test_no_mermaid_fence_in_the_pages() -> None:
    """Diagrams are text blocks: a Mermaid fence renders only with mermaid.js, which Material loads from a CDN."""
    fence = re.compile(r"^ {0,3}(`{3,}|~{3,})\s*mermaid\b", re.MULTILINE)
    hits = [str(p.relative_to(REPO)) for p in [REPO / "README.md", *sorted(DOCS.rglob("*.md"))]
            if fence.search(p.read_text(encoding="utf-8"))]
    assert not hits, hits


def _text_files() -> list[Path]:
    files = [REPO / "README.md", REPO / "mkdocs.yml", REPO / "scripts" / "build_notebooks.py"]
    files += sorted(DOCS.rglob("*.md")) + sorted((REPO / "notebooks").glob("*.ipynb"))
    return files


def test_no_session_diary_in_the_docs() -> None:
    # The docs are written by topic: history lives in git, not in headings or file names.
    pattern = re.compile(r"session[ _-]?\d+", re.IGNORECASE)
    hits = [f"{p.relative_to(REPO)}: {m.group(0)}" for p in _text_files()
            for m in pattern.finditer(p.read_text(encoding="utf-8"))]
    hits += [str(p.relative_to(REPO)) for p in (DOCS / "bench").rglob("*") if pattern.search(p.name)]
    hits += [str(p.relative_to(REPO)) for p in (REPO / "notebooks").rglob("*") if pattern.search(p.name)]
    assert not hits, hits


def test_the_result_files_the_docs_cite_exist() -> None:
    cited: set[str] = set()
    for page in [REPO / "README.md", *DOCS.rglob("*.md")]:
        text = page.read_text(encoding="utf-8")
        cited |= set(re.findall(r"`((?:docs/bench/)?[a-z0-9-]+-(?:(?:\d+x)?h[12]00|cpu)\.jsonl?)`", text))
    assert cited, "no result file is cited"
    missing = sorted(c for c in cited if not (DOCS / "bench" / Path(c).name).is_file())
    assert not missing, missing


RESULT_FILE = re.compile(r"`((?:docs/bench/)?[a-z0-9-]+\.jsonl?)`")
NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")


def _table_after(path: Path, heading: str) -> list[list[str]]:
    """The cells of the rows of the first Markdown table after ``heading`` (header and rule rows left out)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    start = lines.index(heading)
    first = next(i for i in range(start, len(lines)) if lines[i].startswith("|"))
    rows = list(itertools.takewhile(lambda ln: ln.startswith("|"), lines[first:]))[2:]
    return [[cell.strip() for cell in row.strip("|").split(" | ")] for row in rows]


def test_the_readme_numbers_are_the_performance_pages() -> None:
    """Each row of the README's table names its result files, and its GPU / tree label and every number of its
    lsr and baseline cells are those of the headline rows of docs/performance/index.md citing the same files."""
    readme = _table_after(REPO / "README.md", "## What is measured")
    headline = _table_after(DOCS / "performance" / "index.md", "## Headline numbers")
    assert len(readme) >= 10 and all(len(row) == 4 for row in readme + headline)
    problems = []
    for what, lsr_cell, baseline, where in readme:
        files = {Path(f).name for f in RESULT_FILE.findall(where)}
        sources = [row for row in headline if files & {Path(f).name for f in RESULT_FILE.findall(row[3])}]
        if not files or not sources:
            problems.append(f"{what}: names no result file of a headline row ({where})")
            continue
        label = where.split("`")[0]
        if any(row[3].split("`")[0] != label for row in sources):
            problems.append(f"{what}: labelled {label!r}, the headline row {sources[0][3].split('`')[0]!r}")
        quoted = {n for row in sources for n in NUMBER.findall(row[1] + " " + row[2])}
        missing = [n for n in NUMBER.findall(lsr_cell + " " + baseline) if n not in quoted]
        if missing:
            problems.append(f"{what}: {missing} not in the headline row(s) citing {sorted(files)}")
    assert not problems, "\n".join(problems)


def test_the_notebooks_extra_names_what_the_notebooks_import() -> None:
    """``pip install -e ".[notebooks]"`` brings every package the notebooks' cells and scripts/build_notebooks.py
    import, and ipykernel, the kernel nbclient runs them in."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")
    extras = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]
    named = {re.match(r"[A-Za-z0-9_.-]+", req).group(0).lower().replace("_", "-") for req in extras.get("notebooks", [])}
    sources = [ast.parse((REPO / "scripts" / "build_notebooks.py").read_text(encoding="utf-8"))]
    for nb in sorted((REPO / "notebooks").glob("*.ipynb")):
        cells = json.loads(nb.read_text(encoding="utf-8"))["cells"]
        sources += [ast.parse("".join(c["source"])) for c in cells if c["cell_type"] == "code"]
    imported = {alias.name.split(".")[0] for tree in sources for node in ast.walk(tree)
                for alias in (node.names if isinstance(node, ast.Import) else [])}
    imported |= {node.module.split(".")[0] for tree in sources for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module and not node.level}
    needed = {m for m in imported if m not in sys.stdlib_module_names and m != "lsr"} | {"ipykernel"}
    assert {"matplotlib", "nbformat", "nbclient"} <= needed  # the scan sees the imports
    assert needed <= named, f"the notebooks extra lacks {sorted(needed - named)}"
