"""lsr on a machine without triton (torch's CPU wheel brings none): every module imports and the SPLADE paths run.

Each test starts a fresh interpreter in which triton cannot be imported (a meta-path finder refuses ``triton``
and ``triton.*``; the prelude checks that it really does) and TRITON_INTERPRET is unset, as on a user's CPU
machine; CUDA is hidden, so ``device: auto`` resolves to the CPU as it does there. What runs is the README's:
the quickstart job (``lsr run configs/quickstart.yaml``, on a slice of SciFact), the same stages as separate
commands (``lsr search --encoder splade``, ``lsr evaluate``), the README's Python snippet, and ``lsr serve``'s
app answering one text query with the SPLADE encoder. The module walk is quick (the fast subset keeps it); the
others load the model and are marked slow.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from lsr.testing import write_scifact_slice
from tests.conftest import DATA, REPO
from tests.docs.test_code_blocks import read_fences

MODEL = DATA / "models" / "splade-tiny"

PRELUDE = """
import sys

class _NoTriton:
    def find_spec(self, name, path=None, target=None):
        if name == "triton" or name.startswith("triton."):
            raise ImportError(f"No module named {name!r} (hidden by tests/core/test_without_triton.py)")
        return None

sys.meta_path.insert(0, _NoTriton())
try:
    import triton  # noqa: F401
except ImportError:
    pass
else:
    raise SystemExit("the prelude failed to hide triton")
"""

# runs lsr's CLI once per argv of the JSON list in argv[1], as `lsr ...` would, and prints each exit code
CLI = """
import json
from lsr.cli import main

for argv in json.loads(sys.argv[1]):
    print("exit", main(argv), flush=True)
"""


def run_without_triton(code: str, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(PYTHONPATH=str(REPO), CUDA_VISIBLE_DEVICES="", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    return subprocess.run([sys.executable, "-c", PRELUDE + code, *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_every_lsr_module_imports_without_triton():
    code = """
import importlib, pkgutil
import lsr

for m in pkgutil.walk_packages(lsr.__path__, "lsr."):
    if m.name != "lsr.__main__":
        try:
            importlib.import_module(m.name)
        except Exception as e:
            print(f"{m.name}: {type(e).__name__}: {e}")
"""
    p = run_without_triton(code)
    assert p.returncode == 0, p.stderr
    assert not p.stdout, "modules that do not import without triton:\n" + p.stdout


@pytest.mark.slow
def test_quickstart_job_and_its_stages_run_without_triton(tmp_path):
    """The README's first command on a slice (3 queries, their abstracts and 10 more), then the same index
    searched and evaluated by the separate commands (the model named as the config names it): the same run and
    metrics."""
    data, out = tmp_path / "scifact", tmp_path / "run"
    n_docs, n_queries = write_scifact_slice(data, DATA, n_queries=3, n_other=10)
    jobs = [["run", "configs/quickstart.yaml", "--set", f"data.dataset={data}", "--set", f"output={out}"],
            ["search", "--index", str(out / "index"), "--queries", f"{data}:test", "--encoder", "splade",
             "--model", "data/models/splade-tiny", "--out", str(tmp_path / "again.trec")],
            ["evaluate", "--run", str(tmp_path / "again.trec"), "--qrels", f"{data}:test",
             "--metrics", "RR@10", "nDCG@10", "R@1000", "--json", str(tmp_path / "again.json")]]
    p = run_without_triton(CLI, json.dumps(jobs))
    assert p.stdout.count("exit 0") == 3, p.stdout + p.stderr
    assert "error" not in p.stderr and "Traceback" not in p.stderr, p.stderr
    result = json.loads((out / "metrics.json").read_text())
    assert (result["n_docs"], result["n_queries"], result["device"]) == (n_docs, n_queries, "cpu")
    metrics = result["metrics"]
    assert set(metrics) == {"RR@10", "nDCG@10", "R@1000"} and metrics["nDCG@10"] > 0.5
    for name, value in metrics.items():  # the job prints its metrics
        assert f"{name}\t{value:.4f}" in p.stdout
    assert json.loads((tmp_path / "again.json").read_text()) == pytest.approx(metrics, abs=1e-9)
    def ranked(path):  # (query, doc, rank, score) rows: the run tag is the job's name or "lsr"
        return [line.split()[:5] for line in path.read_text().splitlines()]

    assert ranked(tmp_path / "again.trec") == ranked(out / "run.trec") != []


@pytest.mark.slow
def test_readme_python_snippet_runs_without_triton():
    readme = REPO / "README.md"
    snippet = next(f.code for f in read_fences(readme) if f.language == "python" and "SpladeEncoder" in f.code)
    p = run_without_triton(snippet)
    assert p.returncode == 0, p.stderr
    docnos, scores = p.stdout.strip().splitlines()[-1].split("] [")
    assert docnos == "['d1', 'd2'" and float(scores.split(",")[0]) > float(scores.split(",")[1].rstrip("]"))


@pytest.mark.slow
def test_serve_answers_a_text_query_with_splade_without_triton(tmp_path):
    pytest.importorskip("fastapi")
    pytest.importorskip("httpx")
    code = f"""
import asyncio
import httpx
import lsr
from lsr.serve.app import create_app

enc = lsr.SpladeEncoder.from_pretrained({str(MODEL)!r}, device="cpu")
texts = ["The capital of France is Paris.", "Berlin is in Germany.", "Insulin lowers blood sugar."]
lsr.InvertedIndex.build(enc.encode_document(texts, ids=["d1", "d2", "d3"]), metadata=enc.describe()).save(
    {str(tmp_path / "idx")!r})
app = create_app({str(tmp_path / "idx")!r}, {str(MODEL)!r}, device="cpu", k=3)

async def ask():
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://lsr") as client:
        return (await client.post("/search", json={{"query": "blood sugar and insulin"}})).json()

print(json.dumps(asyncio.run(ask())))
"""
    p = run_without_triton("import json\n" + code)
    assert p.returncode == 0, p.stderr
    answer = json.loads(p.stdout.strip().splitlines()[-1])
    assert answer["results"][0]["docnos"][0] == "d3", answer
