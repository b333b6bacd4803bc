"""Config loading, overrides and the lazy package import."""

from __future__ import annotations

import subprocess
import sys

import pytest

from lsr.config import load_config
from tests.conftest import REPO


def test_every_shipped_config_loads():
    paths = sorted(p for p in (REPO / "configs").glob("*.yaml") if not p.name.startswith("train-"))
    assert paths  # (train-*.yaml are lsr train configs: tests/train/test_train.py loads them)
    for p in paths:
        cfg = load_config(p)
        assert cfg.encoder.kind in ("bm25", "splade") and cfg.search.k > 0


def test_overrides_parse_yaml_values(tmp_path):
    cfg = load_config(REPO / "configs" / "quickstart.yaml",
                      ["encoder.k1=1.2", "search.k=10", "metrics=[nDCG@10]", f"output={tmp_path}"])
    assert cfg.encoder.k1 == 1.2 and cfg.search.k == 10 and cfg.metrics == ("nDCG@10",)
    assert cfg.output == str(tmp_path)
    with pytest.raises(ValueError, match="unknown key"):
        load_config(REPO / "configs" / "quickstart.yaml", ["encoder.kk=1"])
    with pytest.raises(ValueError, match="key=value"):
        load_config(None, ["search.k"])


def test_import_lsr_is_light():
    code = ("import sys, lsr; heavy = [m for m in ('torch', 'triton', 'transformers', 'datasets', 'ir_datasets')"
            " if m in sys.modules]; print(','.join(heavy))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.strip() == ""
    out = subprocess.run([sys.executable, "-c", "import lsr; print(lsr.SparseVectors.__name__)"],
                         capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.strip() == "SparseVectors"
