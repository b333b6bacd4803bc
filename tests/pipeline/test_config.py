"""The config schema (run and train share sections), loading, dotted overrides, one-line errors, and the lazy
package import."""

from __future__ import annotations

import subprocess
import sys
from typing import get_type_hints

import pytest

from lsr.cli import main
from lsr.config import DataConfig, EncoderConfig, EvaluationConfig, RunConfig, load_config
from lsr.train.config import TrainConfig, load_train_config
from tests.conftest import REPO


def test_every_shipped_config_loads():
    paths = sorted(p for p in (REPO / "configs").glob("*.yaml") if not p.name.startswith("train-"))
    assert paths  # (train-*.yaml are lsr train configs: tests/train/test_train.py loads them)
    for p in paths:
        cfg = load_config(p)
        assert cfg.encoder.kind in ("bm25", "splade") and cfg.search.k > 0


def test_overrides_parse_yaml_values(tmp_path):
    cfg = load_config(REPO / "configs" / "quickstart.yaml",
                      ["encoder.k1=1.2", "search.k=10", "evaluation.metrics=[nDCG@10]", f"output={tmp_path}",
                       "data.split=dev", "search.backend=torch", "rerank.maxsim=triton", "encoder.head=torch"])
    assert cfg.encoder.k1 == 1.2 and cfg.search.k == 10 and cfg.evaluation.metrics == ("nDCG@10",)
    assert cfg.output == str(tmp_path) and cfg.data == DataConfig("data/scifact", "dev")
    assert (cfg.search.backend, cfg.rerank.maxsim, cfg.encoder.head) == ("torch", "triton", "torch")
    assert cfg.encoder.max_length_doc == 256   # keys the overrides leave alone keep the file's values
    with pytest.raises(ValueError, match="key=value"):
        load_config(None, ["search.k"])


def test_run_and_train_configs_share_their_sections(tmp_path):
    """The encoder, data and evaluation sections are the same dataclasses in both schemas, read by one
    loader; training's defaults of a shared section are its own (kind splade, 64 / 256 tokens)."""
    for name, section in (("encoder", EncoderConfig), ("data", DataConfig), ("evaluation", EvaluationConfig)):
        assert get_type_hints(RunConfig)[name] is section is get_type_hints(TrainConfig)[name]
    sets = ["encoder.model=m", "encoder.head=torch", "data.dataset=d", "evaluation.metrics=RR@10"]
    run = load_config(None, ["encoder.kind=splade", *sets])
    train = load_train_config(None, ["output=o", "optim.max_steps=7", "negatives.count=0", *sets])
    assert run.encoder.head == train.encoder.head == "torch" and run.data.dataset == train.data.dataset == "d"
    assert run.evaluation == train.evaluation == EvaluationConfig(metrics=("RR@10",))
    assert (train.encoder.kind, train.encoder.max_length_query, train.encoder.max_length_doc) == ("splade", 64, 256)
    assert train.data.split == "train" and train.optim.max_steps == 7
    check = EvaluationConfig(expected={"RR@10": 0.5, "R@100": 0.9}, tolerance=0.01)   # lsr run --check
    assert check.missed({"RR@10": 0.505, "R@100": 0.85}) == {"R@100": (0.85, 0.9)}
    assert check.missed({"R@100": 0.9}) == {"RR@10": (None, 0.5)}
    for cfg, load in ((run, load_config), (train, load_train_config)):   # saved, they load back equal
        cfg.save(tmp_path / "c.yaml")
        assert load(tmp_path / "c.yaml") == cfg


@pytest.mark.parametrize("override, message", [
    ("encoder.kk=1", "unknown key(s) in config.encoder: ['kk'] (known: ['attention', 'b', 'batch_size', 'compile',"),
    ("metrics=[RR@10]", "unknown key(s) in config: ['metrics'] (known: ['data', 'device', 'encoder', 'evaluation', 'filter', "
                        "'index', 'inputs', 'name', 'output', 'rerank', 'search']); did you mean evaluation.metrics?"),
    ("search.k=ten", "config.search.k must be int, got 'ten'"),
    ("search.k=0", "config.search.k must be >= 1, got 0"),
    ("search.k=99999999999999999999999", "config.search.k must be >= 1 and <= 9223372036854775807, got 9999"),
    ("encoder.b=1.5", "config.encoder.b must be a number in [0, 1], got 1.5"),
    ("index.block_size=3", "config.index.block_size must be a power of two in [1, 1048576], got 3"),
    ("index.partitions=100000", "config.index.partitions must be an integer in [1, 65536], got 100000"),
    ("encoder.tokenize_workers=5000", "config.encoder.tokenize_workers must be an integer in [0, 1024], got 5000"),
    ("encoder.k1=.inf", "config.encoder.k1 must be a finite number, got inf"),
    ("search.backend=triton", "config.search.backend must be one of auto, torch, gpu, got 'triton'"),
    ("search.graphs.enabled=maybe", "config.search.graphs.enabled must be bool, got 'maybe'"),
    ("search.doc_vectors=d", "config.search.doc_vectors is now inputs.doc_vectors: rename the key"),
    ("rerank.maxsim=cuda", "config.rerank.maxsim must be one of auto, triton, torch, got 'cuda'"),
    ("encoder.dtype=int8", "config.encoder.dtype must be one of bfloat16, bf16, float16, fp16, float32, fp32"),
    ("data=5", "config.data must be a mapping of keys to values, got 5"),
    ("data.dataset=null", "config.data.dataset is required"),
    ("evaluation.metrics=[FOO@3]", "config.evaluation: unknown metric"),
])
def test_config_errors_are_one_line_and_name_the_key(override, message):
    with pytest.raises(ValueError) as e:
        load_config(REPO / "configs" / "quickstart.yaml", [override])
    assert message in str(e.value) and "\n" not in str(e.value)


def test_cli_reports_a_bad_config_key_as_a_usage_error(capsys):
    assert main(["run", str(REPO / "configs" / "quickstart.yaml"), "--set", "search.backend=triton"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "lsr run: error: config.search.backend must be one of auto, torch, gpu, got 'triton'"
    assert main(["run", str(REPO / "configs" / "quickstart.yaml"), "--set", "index.partitions=10**30"]) == 2
    assert capsys.readouterr().err.strip() == "lsr run: error: config.index.partitions must be int, got '10**30'"
    assert main(["run", str(REPO / "configs" / "quickstart.yaml"), "--set", "index.partitions=100000"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "lsr run: error: config.index.partitions must be an integer in [1, 65536], got 100000"


def test_import_lsr_is_light():
    code = ("import sys, lsr; heavy = [m for m in ('torch', 'triton', 'transformers', 'datasets', 'ir_datasets')"
            " if m in sys.modules]; print(','.join(heavy))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.strip() == ""
    out = subprocess.run([sys.executable, "-c", "import lsr; print(lsr.SparseVectors.__name__)"],
                         capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.strip() == "SparseVectors"
