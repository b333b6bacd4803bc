"""The README's main job: configs/quickstart.yaml encodes SciFact with the shipped SPLADE model.

The full 5,183-document job takes minutes on a CPU, so it is not run here: these tests check that the
config is the documented job, that the shipped model is the one SOURCE.md describes, and run the whole
pipeline with that model on a slice of SciFact.
"""

from __future__ import annotations

import hashlib
import json
import re

import pytest
import torch

from lsr.cli import main
from lsr.config import load_config
from lsr.testing import write_scifact_slice
from tests.conftest import DATA, REPO

pytest.importorskip("transformers")

MODEL = DATA / "models" / "splade-tiny"


def test_quickstart_config_is_the_splade_job_on_the_shipped_model():
    cfg = load_config(REPO / "configs" / "quickstart.yaml")
    assert cfg.encoder.kind == "splade" and (REPO / cfg.encoder.model).resolve() == MODEL.resolve()
    assert (cfg.encoder.max_length_doc, cfg.encoder.max_length_query) == (256, 64)
    assert (REPO / cfg.data.dataset).resolve() == (DATA / "scifact").resolve() and cfg.data.split == "test"
    assert cfg.device == "auto" and cfg.search.k == 1000
    ev = cfg.evaluation
    assert set(ev.expected) == {"RR@10", "nDCG@10", "R@1000"} <= set(ev.metrics)
    assert ev.expected["nDCG@10"] == pytest.approx(0.6436) and ev.tolerance == pytest.approx(0.002)
    bm25 = load_config(REPO / "configs" / "scifact-bm25.yaml")
    assert bm25.encoder.kind == "bm25" and bm25.output == "runs/scifact-bm25"
    assert bm25.evaluation.expected["nDCG@10"] == pytest.approx(0.6789)


def test_shipped_model_matches_its_source_md():
    found = re.findall(r"^([0-9a-f]{64})  (\S+)$", (MODEL / "SOURCE.md").read_text(), re.MULTILINE)
    listed = {name: digest for digest, name in found}
    assert set(listed) == {"model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json"}
    for name, digest in listed.items():
        assert hashlib.sha256((MODEL / name).read_bytes()).hexdigest() == digest, name


def test_shipped_model_is_a_trained_splade_model():
    from lsr.encode.splade.encoder import SpladeEncoder

    enc = SpladeEncoder.from_pretrained(MODEL, device="cpu")
    q = enc.encode_query(["what is the cost of a canine ultrasound"])
    top = [tok for tok, _ in enc.decode(q, top_k=5)[0]]
    assert {"ultrasound", "cost", "canine"} <= set(top)  # SOURCE.md's sanity check
    assert 0 < q.nnz < 100  # sparse, unlike an untrained head


@pytest.mark.slow
def test_quickstart_pipeline_on_a_scifact_slice(tmp_path):
    n_docs, n_queries = write_scifact_slice(tmp_path / "scifact", DATA)
    out = tmp_path / "run"
    assert main(["run", str(REPO / "configs" / "quickstart.yaml"), "--set", f"data.dataset={tmp_path / 'scifact'}",
                 "--set", f"encoder.model={MODEL}", "--set", f"output={out}", "--set", "device=cpu",
                 "--json", str(out / "m.json")]) == 0
    result = json.loads((out / "metrics.json").read_text())
    assert (result["n_docs"], result["n_queries"]) == (n_docs, n_queries)
    assert result["metrics"]["nDCG@10"] > 0.5  # a trained model finds the relevant abstracts among ~50
    # the vectors the job wrote equal the reference (torch twin) head applied to the same model
    from lsr.data.sources import load_dataset
    from lsr.encode.splade.encoder import SpladeEncoder
    from lsr.storage.shards import read_vectors

    written = read_vectors(out / "doc_vectors")
    ids, texts = zip(*load_dataset(str(tmp_path / "scifact"), "test").docs_iter())
    assert list(written.ids) == list(ids)
    twin = SpladeEncoder.from_pretrained(MODEL, device="cpu", backend="torch")
    reference = twin.encode_document(list(texts), ids=list(ids))
    assert reference.nnz > 50 * len(ids)
    torch.testing.assert_close(written.to_dense(), reference.to_dense(), rtol=1e-4, atol=1e-5)
