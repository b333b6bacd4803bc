"""Public API conventions: lazy subpackages, ``lsr.evaluate`` always the function, one-line CLI errors."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import warnings

import pytest

from lsr.cli import main


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("imports", ["lsr.evaluation.topk", "lsr.evaluation", "lsr.evaluation.measures, lsr.cli",
                                     "lsr.search, lsr.evaluation.topk, lsr.pipeline"])
@pytest.mark.slow
def test_evaluate_stays_callable_whatever_is_imported(imports):
    code = (f"import lsr, {imports}\nassert callable(lsr.evaluate), lsr.evaluate\n"
            "print(lsr.evaluate({'q': {'d': 1.0}}, {'q': {'d': 1}}, metrics=['RR@10']))")
    out = _python(code)
    assert out.returncode == 0, out.stderr
    assert "{'RR@10': 1.0}" in out.stdout


@pytest.mark.slow
def test_subpackages_are_reachable_lazily_and_import_lsr_stays_light():
    code = ("import sys, lsr\n"
            "heavy = [m for m in ('torch', 'triton', 'transformers') if m in sys.modules]\n"
            "assert not heavy, heavy\n"
            "assert lsr.search.Searcher is lsr.Searcher\n"
            "assert callable(lsr.evaluation.evaluate) and callable(lsr.interop.read_anserini_queries)\n"
            "assert lsr.index.InvertedIndex is lsr.InvertedIndex and lsr.encode.__name__ == 'lsr.encode'\n")
    out = _python(code)
    assert out.returncode == 0, out.stderr


def test_encoders_follow_the_protocol_without_plural_aliases():
    from lsr.encode.base import Encoder
    from lsr.encode.bm25.lexical import LexicalEncoder

    enc = LexicalEncoder().fit(["apple pie", "banana split"])
    assert isinstance(enc, Encoder)
    assert not hasattr(enc, "encode_queries") and not hasattr(enc, "encode_documents")  # never released
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        enc.encode_document(["apple pie"], ids=["d1"])


def test_version_and_help_show_defaults(capsys):
    assert main(["--version"]) == 0 and capsys.readouterr().out.startswith("lsr ")
    assert main(["search", "--help"]) == 0
    assert "(default: trec)" in capsys.readouterr().out


@pytest.mark.slow
def test_stage_packages_export_their_names_on_first_use():
    """``from lsr.storage import read_vectors`` and the like work, and importing the packages (or the light
    ``lsr.storage.files``) loads no torch until such a name is used."""
    code = ("import sys\nimport lsr.benchmarks, lsr.data, lsr.parallel, lsr.storage, lsr.storage.files, lsr.utils\n"
            "assert 'torch' not in sys.modules\n"
            "from lsr.storage import read_vectors, write_vectors\nfrom lsr.parallel import rank_job, search_sharded\n"
            "from lsr.data import load_dataset\nfrom lsr.utils import resolve_device\n"
            "from lsr.benchmarks import synth_docs\nfrom lsr.pipeline import run_pipeline\n"
            "from lsr.sparse import SparseVectors\n"
            "assert read_vectors.__module__ == 'lsr.storage.shards' and 'read_vectors' in dir(lsr.storage)\n"
            "assert rank_job.__module__ == 'lsr.parallel.jobs'\n")
    out = _python(code)
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize("args,code,text", [
    (["run", "configs/quickstart.yaml", "--set", "k=["], 2, "not valid YAML"),
    (["run", "configs/quickstart.yaml", "--set", "encoder=5"], 2, "config.encoder must be a mapping"),
    (["run", "configs/quickstart.yaml", "--set", "encoder.k1=abc"], 2, "config.encoder.k1 must be float"),
    (["run", "configs/quickstart.yaml", "--set", "evaluation.metrics=5"], 2, "config.evaluation.metrics must be a list of strings"),
    (["run", "configs/quickstart.yaml", "--set", "evaluation.metrics=[FOO@3]"], 2, "unknown metric"),
    (["run", "no-such-config.yaml"], 2, "not found"),
    (["evaluate", "--run", "tests", "--qrels", "data/scifact"], 1, "is a directory"),
])
def test_bad_input_is_one_line_with_the_right_exit_code(args, code, text, capsys, tmp_path, monkeypatch):
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    monkeypatch.chdir(repo)
    out_dir = tmp_path / "out"
    rc = main(args + (["--set", f"output={out_dir}"] if args[0] == "run" and "--set" in args else []))
    err = capsys.readouterr().err
    assert rc == code, err
    assert text in err and err.count("\n") == 1 and "Traceback" not in err
    assert not out_dir.exists(), "a bad config must fail before any work"


def test_atomic_writes_use_the_umask(tmp_path):
    from lsr.storage.files import atomic_write_text

    mask = os.umask(0o022)
    try:
        atomic_write_text(tmp_path / "a.txt", "x")
    finally:
        os.umask(mask)
    assert stat.S_IMODE((tmp_path / "a.txt").stat().st_mode) == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["a.txt"]   # no temporary left behind
