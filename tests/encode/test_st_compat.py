"""sentence-transformers compatibility: SparseEncoder checkpoints (SPLADE, sum pooling, the inference-free
Router layout) load in lsr with the same vectors as ``SparseEncoder.encode_query`` / ``encode_document``,
and lsr encoders saved with ``save_pretrained`` load in sentence-transformers with the same vectors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from lsr.testing import save_tiny_mlm

st = pytest.importorskip("sentence_transformers")
from sentence_transformers import SparseEncoder
from sentence_transformers.sparse_encoder.modules import (
    MLMTransformer,
    Router,
    SparseStaticEmbedding,
    SpladePooling,
    Transformer,
)

from lsr.encode.splade.encoder import SpladeEncoder

TEXTS = [
    "what is the capital of france",
    "",
    "cells cells cells divide; cells!",
    ("Alterations of the architecture of cerebral white matter in the developing human brain can affect "
     "cortical development and result in functional disabilities. A line scan diffusion-weighted magnetic "
     "resonance imaging (MRI) sequence with diffusion tensor analysis was applied."),
    "Vitamin D deficiency is associated with an increased risk of infection in adults.",
]


def _splade(mlm: Path, max_len: int, pooling: str, activation: str, legacy: bool = False) -> list:
    body = (MLMTransformer(str(mlm), max_seq_length=max_len) if legacy
            else Transformer(str(mlm), transformer_task="fill-mask", max_seq_length=max_len))
    return [body, SpladePooling(pooling, activation)]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, data_dir) -> dict[str, Path]:
    """ST checkpoint folders saved by sentence-transformers itself from tiny random masked LMs."""
    root = tmp_path_factory.mktemp("st")
    bert, roberta = save_tiny_mlm("bert", root / "bert", data_dir), save_tiny_mlm("roberta", root / "roberta", data_dir)
    out = {"plain": bert}
    models = {"max_relu": _splade(bert, 24, "max", "relu"),
              "sum_log1p": _splade(bert, 32, "sum", "log1p_relu", legacy=True),
              "max_log1p": _splade(bert, 64, "max", "log1p_relu")}
    doc = _splade(roberta, 40, "max", "log1p_relu")
    torch.manual_seed(0)
    table = torch.rand(len(doc[0].tokenizer.get_vocab())) * (torch.rand(len(doc[0].tokenizer.get_vocab())) > 0.2)
    static = SparseStaticEmbedding(tokenizer=doc[0].tokenizer, weight=table, frozen=True)
    models["inference_free"] = [Router.for_query_document(query_modules=[static], document_modules=doc)]
    for name, modules in models.items():
        SparseEncoder(modules=modules, device="cpu").save(str(root / name))
        out[name] = root / name
    return out


def assert_same_vectors(lsr_out, st_out) -> None:
    """max abs diff <= 1e-5 and the same support (non-zero pattern)."""
    a, b = lsr_out.to_dense(), st_out.to_dense().float()
    assert a.shape == b.shape
    assert torch.equal(a != 0, b != 0)
    assert (a - b).abs().max().item() <= 1e-5


@pytest.mark.parametrize(("name", "varlen"), [("max_relu", False), ("sum_log1p", False), ("inference_free", False),
                                            ("max_log1p", True)])  # varlen: the padding-free body and packed head
def test_st_checkpoint_matches_sentence_transformers(checkpoints, name, varlen):
    ref = SparseEncoder(str(checkpoints[name]), device="cpu")
    enc = SpladeEncoder.from_pretrained(checkpoints[name], device="cpu", backend="torch", batch_size=2, varlen=varlen)
    assert enc.max_length_doc == ref.max_seq_length  # the checkpoint's length, not lsr's 256 default
    for kind in ("query", "document"):
        ours, theirs = getattr(enc, f"encode_{kind}")(TEXTS), getattr(ref, f"encode_{kind}")(TEXTS)
        assert (theirs.to_dense() != 0).sum(1).min() > 0 or kind == "query"  # not vacuous
        assert_same_vectors(ours, theirs)


def test_checkpoint_settings_are_read(checkpoints):
    d = SpladeEncoder.from_pretrained(checkpoints["sum_log1p"], device="cpu").describe()
    assert (d["pooling"], d["activation"], d["max_length_doc"], d["max_length_query"]) == (
        "sum", "log1p_log1p_relu", 32, 32)
    enc = SpladeEncoder.from_pretrained(checkpoints["inference_free"], device="cpu")
    assert enc.describe()["query_encoder"] == "static" and enc.vocab_size == 500
    # a static query is the table's weights of its distinct tokens: no [CLS]/<s>, repeats counted once
    q = enc.encode_query(["cells cells"]).to_dense()[0]
    ids = enc.prepare(["cells cells"], "query").batches[0].input_ids[0]
    table = SparseEncoder(str(checkpoints["inference_free"]), device="cpu")[0].sub_modules["query"][0].weight
    assert set(q.nonzero().flatten().tolist()) == {i for i in set(ids.tolist()) if table[i] > 0}
    assert 0 not in ids.tolist()  # the tokenizer's <s> is id 0


def test_sparse_tensor_output(checkpoints):
    enc = SpladeEncoder.from_pretrained(checkpoints["max_relu"], device="cpu")
    t = enc.encode_document(TEXTS, convert_to_sparse_tensor=True)
    ref = SparseEncoder(str(checkpoints["max_relu"]), device="cpu").encode_document(TEXTS)
    assert t.layout == torch.sparse_coo and t.is_coalesced() and t.shape == ref.shape
    assert_same_vectors(t, ref)


def test_save_pretrained_loads_in_sentence_transformers(checkpoints, tmp_path):
    enc = SpladeEncoder.from_pretrained(checkpoints["plain"], device="cpu", max_length_query=16, max_length_doc=48)
    out = enc.save_pretrained(tmp_path / "saved")
    ref = SparseEncoder(str(out), device="cpu")
    assert ref.max_seq_length == 48
    assert_same_vectors(enc.encode_document(TEXTS), ref.encode_document(TEXTS))
    short = [t for t in TEXTS if len(t) < 60]  # ST truncates queries at the one (document) length
    assert_same_vectors(enc.encode_query(short), ref.encode_query(short))
    again = SpladeEncoder.from_pretrained(out, device="cpu")
    assert (again.max_length_query, again.max_length_doc) == (16, 48)  # lsr_config.json keeps both
    assert again.encode_query(TEXTS).equal(enc.encode_query(TEXTS))


def test_save_inference_free_round_trip(checkpoints, tmp_path):
    enc = SpladeEncoder.from_pretrained(checkpoints["inference_free"], device="cpu")
    ref = SparseEncoder(str(enc.save_pretrained(tmp_path / "saved")), device="cpu")
    for kind in ("query", "document"):
        assert_same_vectors(getattr(enc, f"encode_{kind}")(TEXTS), getattr(ref, f"encode_{kind}")(TEXTS))


def test_save_never_overwrites_unasked(checkpoints, tmp_path):
    enc = SpladeEncoder.from_pretrained(checkpoints["plain"], device="cpu")
    target = tmp_path / "mine"
    target.mkdir()
    (target / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="overwrite=True"):
        enc.save_pretrained(target)
    with pytest.raises(ValueError, match="not a model folder"):
        enc.save_pretrained(target, overwrite=True)
    assert (target / "notes.txt").read_text() == "keep me" and sorted(p.name for p in tmp_path.iterdir()) == ["mine"]
    enc.save_pretrained(tmp_path / "model")
    enc.save_pretrained(tmp_path / "model", overwrite=True)  # a model folder may be replaced when asked
    assert (tmp_path / "model" / "modules.json").is_file()


def _copy_with_modules(src: Path, dst: Path, modules: list[dict]) -> Path:
    dst.mkdir(parents=True)
    for f in src.rglob("*"):
        if f.is_file():
            (dst / f.relative_to(src)).parent.mkdir(parents=True, exist_ok=True)
            (dst / f.relative_to(src)).write_bytes(f.read_bytes())
    (dst / "modules.json").write_text(json.dumps(modules))
    return dst


def test_unsupported_checkpoints_fail_with_one_line(checkpoints, tmp_path):
    mods = json.loads((checkpoints["max_relu"] / "modules.json").read_text())
    bad = _copy_with_modules(checkpoints["max_relu"], tmp_path / "dense", mods[:1] + [
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}])
    with pytest.raises(ValueError, match="not a SPLADE model") as e:
        SpladeEncoder.from_pretrained(bad, device="cpu")
    assert "\n" not in str(e.value)
    odd = _copy_with_modules(checkpoints["max_relu"], tmp_path / "odd", mods)
    (odd / "1_SpladePooling" / "config.json").write_text(json.dumps({"pooling_strategy": "mean"}))
    with pytest.raises(ValueError, match="pooling_strategy 'mean'"):
        SpladeEncoder.from_pretrained(odd, device="cpu")


def test_shipped_splade_tiny_matches_sentence_transformers(data_dir):
    path = data_dir / "models" / "splade-tiny"
    ref = SparseEncoder(str(path), device="cpu")  # a plain HF folder: ST adds SpladePooling(max, relu)
    ref.max_seq_length = 256
    enc = SpladeEncoder.from_pretrained(path, device="cpu", max_length_query=256, max_length_doc=256)
    for kind in ("query", "document"):
        assert_same_vectors(getattr(enc, f"encode_{kind}")(TEXTS), getattr(ref, f"encode_{kind}")(TEXTS))


def test_hub_id_loads_from_the_cache_offline(checkpoints, tmp_path, monkeypatch):
    """A hub id of an ST repository resolves through the Hugging Face cache (no network: HF_HUB_OFFLINE)."""
    constants = pytest.importorskip("huggingface_hub.constants")
    commit = "0" * 40
    repo = tmp_path / "hub" / "models--org--tiny-splade"
    _copy_with_modules(checkpoints["sum_log1p"], repo / "snapshots" / commit,
                       json.loads((checkpoints["sum_log1p"] / "modules.json").read_text()))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    # huggingface_hub reads HF_HUB_CACHE from the environment once, at import: its constant is the only handle
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    enc = SpladeEncoder.from_pretrained("org/tiny-splade", device="cpu")
    assert enc.describe()["model"] == "org/tiny-splade" and enc.describe()["pooling"] == "sum"
    ref = SparseEncoder(str(checkpoints["sum_log1p"]), device="cpu")
    assert_same_vectors(enc.encode_document(TEXTS), ref.encode_document(TEXTS))
    with pytest.raises(OSError, match="not in the Hugging Face cache"):
        SpladeEncoder.from_pretrained("org/absent-model", device="cpu")


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["max_log1p", "inference_free", "sum_log1p"])
def test_st_checkpoint_on_cuda(checkpoints, name):
    """On CUDA in fp32: the Triton (packed) head, the padding-free body and the static table on the device."""
    ref = SparseEncoder(str(checkpoints[name]), device="cuda")
    enc = SpladeEncoder.from_pretrained(checkpoints[name], device="cuda", dtype=torch.float32, varlen=True)
    for kind in ("query", "document"):
        ours, theirs = getattr(enc, f"encode_{kind}")(TEXTS), getattr(ref, f"encode_{kind}")(TEXTS).cpu()
        assert_same_vectors(ours, theirs)


def test_a_token_weight_table_shorter_than_the_tokenizer_is_refused(checkpoints, tmp_path):
    """The inference-free query route's table must have a row for every id its tokenizer emits."""
    from safetensors.torch import load_file, save_file

    bad = _copy_with_modules(checkpoints["inference_free"], tmp_path / "short",
                             json.loads((checkpoints["inference_free"] / "modules.json").read_text()))
    (weights,) = [p for p in bad.rglob("model.safetensors") if list(load_file(str(p))) == ["weight"]]
    table = load_file(str(weights))["weight"]
    save_file({"weight": table[:-3].contiguous()}, str(weights))
    with pytest.raises(ValueError, match=f"the tokenizer has {table.shape[0]} tokens but the token weight "
                                         f"table has {table.shape[0] - 3} rows") as e:
        SpladeEncoder.from_pretrained(bad, device="cpu")
    assert str(e.value).startswith(str(weights.parent)) and "\n" not in str(e.value)
