"""The search section of a config reaches the Searcher's plan: a route, a span scorer and a tuning knob set in a run
YAML (``lsr run``, whose metrics.json records the plan it searched with) and with ``--set search.<key>=...``
(``lsr run`` and ``lsr search --explain``); keys of earlier configs are refused with one line naming their new
place. CPU, the gpu backend under TRITON_INTERPRET=1 (tests/conftest.py), on a slice of SciFact with BM25."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from lsr.cli import main
from lsr.testing import write_scifact_slice
from tests.conftest import DATA


def plan_lines(text: str) -> dict[str, str]:
    """{step: "choice  (why)"} of the search plan in a printed text (from its title on)."""
    text = text[text.index("search plan: "):]
    rows = [row.strip() for row in text.splitlines() if row.startswith("  ")]
    return {name.strip(): rest.strip() for name, rest in (row.split("  ", 1) for row in rows)}


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run YAML on a slice of SciFact (46 docs, 6 queries) that forces the block route, the torch twin scorer and
    32-doc spans through its search section."""
    root = tmp_path_factory.mktemp("search-config")
    write_scifact_slice(root / "data", DATA)
    config = {"name": "forced", "device": "cpu", "data": {"dataset": str(root / "data")},
              "encoder": {"kind": "bm25"}, "evaluation": {"metrics": ["nDCG@10"]},
              "search": {"k": 10, "backend": "gpu", "route": "block", "scorer": "torch", "triton": {"span": 32}}}
    (root / "job.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    return root


def run_plan(job: Path, out: str, *sets: str) -> dict[str, str]:
    argv = ["run", str(job / "job.yaml"), "--set", f"output={job / out}"]
    assert main(argv + [arg for s in sets for arg in ("--set", s)]) == 0
    return plan_lines(json.loads((job / out / "metrics.json").read_text())["search_plan"])


def test_route_scorer_and_knob_from_the_yaml_reach_the_plan(job, capsys):
    got = run_plan(job, "from-yaml")
    assert got["backend"] == "gpu  (forced by config)"
    assert got["route"] == "block  (forced by config)"
    assert got["span scorer"] == "torch, span 32 (2 spans)  (forced by config)"


def test_set_overrides_the_yaml_on_the_way_to_the_plan(job, capsys):
    got = run_plan(job, "from-set", "search.scorer=triton", "search.triton.span=64", "search.k=5")
    assert got["span scorer"] == "triton, span 64 (1 spans)  (forced by config)"
    assert got["query batches"].startswith("1 of <= 6")
    assert run_plan(job, "dense", "search.route=dense-scatter")["route"] == "dense-scatter  (forced by config)"
    lines = (job / "from-set" / "run.trec").read_text().splitlines()
    assert max(int(line.split()[3]) for line in lines) == 5, "search.k=5 from --set"


def test_lsr_search_explain_takes_set(job, capsys):
    assert main(["run", str(job / "job.yaml"), "--set", f"output={job / 'idx'}"]) == 0
    argv = ["search", "--index", str(job / "idx" / "index"), "--queries", str(job / "data"), "--device", "cpu",
            "--model", str(job / "idx" / "encoder"), "--explain"]
    capsys.readouterr()
    assert main(argv + ["--set", "search.backend=gpu", "--set", "search.route=block", "--set", "search.scorer=torch",
                        "--set", "search.triton.span=32", "--set", "search.coarse.min_batch=1"]) == 0
    got = plan_lines(capsys.readouterr().out)
    assert got["span scorer"] == "torch, span 32 (2 spans)  (forced by config)"
    assert got["pass 2"].startswith("coarse 16-bit sums") and got["pass 2"].endswith("(6 queries >= coarse.min_batch)")
    assert main(argv + ["--set", "search.backend=gpu", "--set", "search.route=block", "--set",
                        "search.coarse.enabled=false", "--k", "7"]) == 0
    out = capsys.readouterr().out
    assert "search plan: 6 queries, k=7" in out
    assert plan_lines(out)["pass 2"].endswith("(coarse.enabled=False)")


@pytest.mark.parametrize("argv, message", [
    (["--set", "search.query_vectors=q.tsv"], "config.search.query_vectors is now inputs.query_vectors: rename the key"),
    (["--set", "search.query_batch=8"], "config.search.query_batch is now search.batches.size: rename the key"),
    (["--set", "search.span=64"], "unknown key(s) in config.search: ['span'] (known: "),
    (["--set", "search.triton.span=48"], "config.search.triton.span must be a power of two in [32, 1073741824], got 48"),
    (["--set", "search.scorer=ptx"], "config.search.scorer must be one of auto, cuda, triton, torch, got 'ptx'"),
])
def test_bad_search_keys_are_one_line_usage_errors(job, capsys, argv, message):
    assert main(["run", str(job / "job.yaml")] + argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("lsr run: error: ") and message in err and "\n" not in err
    if "span=64" in argv[1]:
        assert err.endswith("did you mean search.triton.span, search.cuda.span, search.coarse.span?")


def test_lsr_search_set_takes_search_keys_only(job, capsys):
    argv = ["search", "--index", str(job), "--queries", str(job / "data"), "--explain"]
    assert main(argv + ["--set", "search.route=csr"]) == 2
    assert capsys.readouterr().err.strip() == ("lsr search: error: search.route must be one of auto, block, "
                                               "dense-scatter, got 'csr'")
    assert main(argv + ["--set", "encoder.k1=2"]) == 2
    assert "only search.<key> can be set here" in capsys.readouterr().err


def test_run_explain_composes_the_plans_and_writes_nothing(job, capsys):
    """``lsr run --explain``: the encode and batch plans before the index exists, and once an earlier run left its
    index in the output folder, the search plan its first batch follows, with the config's forced choices."""
    fresh = job / "explain-fresh"
    assert main(["run", str(job / "job.yaml"), "--set", f"output={fresh}", "--explain"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("encode plan\n  documents  bm25") and "\nbatch plan: 6 queries" in text
    assert "search plan\n  plan      after the index is built" in text
    assert not fresh.exists(), "--explain writes nothing"
    run_plan(job, "explain-after")
    assert main(["run", str(job / "job.yaml"), "--set", f"output={job / 'explain-after'}", "--set",
                 "search.triton.span=64", "--explain"]) == 0
    got = plan_lines(capsys.readouterr().out)
    assert got["route"] == "block  (forced by config)"
    assert got["span scorer"] == "torch, span 64 (1 spans)  (forced by config)"


def test_a_filter_section_restricts_the_run_and_the_plan_says_how(job, capsys):
    """``filter.deny_docnos`` from --set: the denied documents leave every query's ranking and the others keep
    their order (the rest of the unfiltered run, moved up); the recorded plan names the filter's route."""
    from lsr.data.runs import read_run

    run_plan(job, "unfiltered")
    full = read_run(job / "unfiltered" / "run.trec")
    denied = sorted({d for hits in full.values() for d in list(hits)[:2]})
    (job / "deny.txt").write_text("\n".join(denied) + "\n", encoding="utf-8")
    got = run_plan(job, "filtered", f"filter.deny_docnos={job / 'deny.txt'}")
    assert got["filter"].startswith("subset") and f"deny {len(denied)} docnos" in got["filter"]
    filtered = read_run(job / "filtered" / "run.trec")
    for qid, hits in full.items():
        kept = [d for d in hits if d not in denied]
        assert list(filtered[qid])[:len(kept)] == kept and not set(filtered[qid]) & set(denied), qid
    (job / "deny.txt").write_text("no-such-doc\n", encoding="utf-8")
    assert main(["run", str(job / "job.yaml"), "--set", f"output={job / 'bad'}",
                 "--set", f"filter.deny_docnos={job / 'deny.txt'}"]) == 1
    assert "'no-such-doc'" in capsys.readouterr().err
