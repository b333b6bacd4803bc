"""``lsr doctor`` prints the facts that decide the routes and every failure memory; the failures of a process are
what ``lsr search --explain`` ends with (nothing when none failed)."""

from __future__ import annotations

import pytest

from lsr.cli.program import main
from lsr.encode.backbone.varlen_body import FLASH_FAILED
from lsr.index.inverted import InvertedIndex
from lsr.storage.shards import write_vectors
from lsr.testing import random_collection


def test_doctor_prints_versions_probes_and_every_failure_memory(capsys):
    import torch

    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert f"torch             {torch.__version__}" in out and "TRITON_INTERPRET" in out
    for probe in ("flash attention", "TMA loads", "nonzero_static", "resident head"):
        assert f"  {probe} " in out, probe
    assert "none disabled in this process" in out
    for name in ("encode.flash_attention", "encode.sparton.resident", "search.block_graphs", "train.graph_step"):
        assert f"  {name}: ok" in out, name


def test_search_explain_ends_with_the_routes_this_process_disabled(tmp_path, capsys):
    docs, queries = random_collection(60, 50, seed=1), random_collection(4, 50, seed=2)
    InvertedIndex.build(docs, device="cpu").save(tmp_path / "idx")
    write_vectors(tmp_path / "q", queries)
    argv = ["search", "--index", str(tmp_path / "idx"), "--queries", str(tmp_path / "q"), "--device", "cpu",
            "--k", "5", "--explain"]
    assert main(argv) == 0
    assert "disabled in this process" not in capsys.readouterr().out
    with pytest.warns(UserWarning, match="flash attention failed"):
        FLASH_FAILED.record(RuntimeError("no flash kernel in this build"))   # what a torch without it raises
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.rstrip().endswith("disabled in this process:\n  encode.flash_attention: varlen_body: flash attention "
                                 "failed (RuntimeError: no flash kernel in this build); using the sdpa twin")
    assert main(["doctor"]) == 0
    assert "1 disabled in this process" in capsys.readouterr().out
