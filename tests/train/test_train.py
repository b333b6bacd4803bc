"""lsr.train on the CPU: a tiny BERT trained a few steps on a 16-document BEIR folder cut from SciFact.

Covers: the loss decreases; checkpoints reload in lsr and in sentence-transformers with equal vectors;
seeded deterministic runs give bit-identical weights; resuming from a checkpoint equals the
uninterrupted run; losses against hand computations; GradCache gives the full-batch gradient;
config errors are one line (exit 2 through the CLI).
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors.torch import load_file

from lsr.cli import main as cli_main
from lsr.train import losses
from lsr.train.config import train_config_from_dict
from lsr.train.trainer import Trainer, train


def config(tiny_model, beir, out, changes=None):
    """A small CPU training config; ``changes``: {dotted key: value}, as ``--set`` gives them."""
    base = {"output": str(out), "device": "cpu", "seed": 3,
            "encoder": {"model": str(tiny_model), "max_length_query": 16, "max_length_doc": 32, "head": "torch"},
            "data": {"dataset": str(beir), "split": "train"}, "negatives": {"count": 0},
            "loss": {"flops_query": 1e-4, "flops_doc": 1e-4}, "optim": {"batch_size": 4, "lr": 3e-3},
            "schedule": {"progress": False, "log_every": 1}}
    return train_config_from_dict(with_changes(base, changes))


def with_changes(base: dict, changes: dict | None) -> dict:
    """``base`` (a nested config dict) with {dotted key: value} ``changes`` set in place, as ``--set`` does."""
    for key, value in (changes or {}).items():
        *sections, name = key.split(".")
        node = base
        for section in sections:
            node = node.setdefault(section, {})
        node[name] = value
    return base


def weights(folder):
    return load_file(str(folder / "model.safetensors"))


def test_trains_reloads_and_matches_sentence_transformers(tiny_model, beir, tmp_path):
    from sentence_transformers import SparseEncoder

    from lsr.encode.splade.encoder import SpladeEncoder

    out = tmp_path / "run"
    cfg = config(tiny_model, beir, out, {"optim.max_steps": 16, "optim.lr": 1e-2, "negatives.mine": "bm25",
                                         "negatives.count": 1, "eval_data.dataset": str(beir),
                                         "eval_data.split": "dev", "evaluation.metrics": ["nDCG@10"]})
    path = train(cfg)
    log = [json.loads(x) for x in (out / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == list(range(1, 17))
    first, last = sum(r["rank_loss"] for r in log[:3]) / 3, sum(r["rank_loss"] for r in log[-3:]) / 3
    assert last < 0.9 * first, (first, last)
    assert all(r["nnz_q"] > 0 and r["nnz_d"] > 0 and r["tokens_per_s"] > 0 for r in log)
    assert json.loads((out / "negatives" / "epoch-0.json").read_text())  # BM25 mined with lsr's index
    metrics = [json.loads(x) for x in (out / "eval.jsonl").read_text().splitlines()]
    assert metrics[-1]["step"] == 16 and 0 <= metrics[-1]["nDCG@10"] <= 1
    before, after = weights(tiny_model), weights(path)
    assert any(not torch.equal(before[k], after[k]) for k in before)
    texts = ["protein folding in yeast", "a study of T cells and tumour growth"]
    lsr_vecs = SpladeEncoder.from_pretrained(path, device="cpu").encode_document(texts, convert_to_sparse_tensor=True)
    st_vecs = SparseEncoder(str(path), device="cpu").encode_document(texts, convert_to_sparse_tensor=True)
    torch.testing.assert_close(lsr_vecs.to_dense(), st_vecs.to_dense().float(), rtol=1e-4, atol=1e-5)


def test_deterministic_runs_are_bit_identical(tiny_model, beir, tmp_path):
    kw = {"optim.max_steps": 3, "optim.deterministic": True}
    paths = [train(config(tiny_model, beir, tmp_path / f"r{i}", kw)) for i in range(2)]
    a, b = (weights(p) for p in paths)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    with pytest.raises(FileExistsError, match="earlier run"):  # never trains over a finished run unasked
        train(config(tiny_model, beir, tmp_path / "r0", {"optim.max_steps": 3}))


def test_resume_equals_uninterrupted(tiny_model, beir, tmp_path):
    kw = {"optim.max_steps": 5, "schedule.save_every": 2, "schedule.keep_checkpoints": None,
          "optim.deterministic": True}
    full = train(config(tiny_model, beir, tmp_path / "full", kw))
    ckpt = tmp_path / "full" / "checkpoints" / "step-00000002"
    assert (ckpt / "trainer_state" / "optimizer.safetensors").is_file()
    resumed = train(config(tiny_model, beir, tmp_path / "resumed", {"resume": str(ckpt), **kw}))
    a, b = weights(full), weights(resumed)
    assert all(torch.equal(a[k], b[k]) for k in a)
    log = [json.loads(x)["step"] for x in (tmp_path / "resumed" / "log.jsonl").read_text().splitlines()]
    assert log == [3, 4, 5]


def _batch_loss(trainer: Trainer, batch: list):
    """The loss function the trainer's step uses for ``batch`` (one process)."""
    from lsr.train.batch_loss import batch_loss_fn

    return batch_loss_fn(trainer.cfg.loss, trainer.data, batch, trainer.step, trainer.device)


def test_grad_cache_equals_full_batch_gradient(tiny_model, beir, tmp_path):
    trainer = Trainer(config(tiny_model, beir, tmp_path / "gc", {"optim.max_steps": 1, "optim.batch_size": 5}))
    from lsr.train.data import epoch_batches

    batch = epoch_batches(trainer.data, trainer.cfg, 0)[0]
    trainer.model.eval()  # no dropout: both passes see the same network
    params = [p for _, p in trainer.model.named_parameters()]
    grads = []
    for chunk in (None, 2):
        for p in params:
            p.grad = None
        queries = [trainer.data.queries[e.qid] for e in batch]
        docs = [trainer.data.docs[e.positive] for e in batch]
        trainer.model.backward(_batch_loss(trainer, batch), queries, docs, chunk)
        grads.append([p.grad.clone() for p in params])
    for full, cached in zip(*grads, strict=True):
        torch.testing.assert_close(cached, full, rtol=1e-4, atol=1e-6)


def test_triples_teacher_scores_and_model_mined_negatives(tiny_model, beir, tmp_path):
    from lsr.data.sources import load_dataset
    from lsr.train.data import epoch_batches

    ds = load_dataset(beir, "train")
    docs = dict(ds.docs_iter())
    ids = sorted(docs)
    lines = [f"{ds.queries[q]}\t{docs[d]}\t{docs[ids[(ids.index(d) + 1) % len(ids)]]}"
             for q, judged in ds.qrels.items() for d in judged]
    (tmp_path / "triples.tsv").write_text("\n".join(lines) + "\n")
    cfg = config(tiny_model, beir, tmp_path / "tri", {"data.dataset": None, "triples": str(tmp_path / "triples.tsv"),
                 "negatives.count": 1, "optim.max_steps": 2, "optim.gradient_checkpointing": True})
    train(cfg)
    assert len((tmp_path / "tri" / "log.jsonl").read_text().splitlines()) == 2
    teacher = [f"{q}\t{d}\t{10.0 if d in ds.qrels[q] else (i % 7) / 7}" for q in ds.qrels for i, d in enumerate(ids)]
    (tmp_path / "teacher.tsv").write_text("\n".join(teacher) + "\n")
    for loss, negatives, n, separate in (("kl", "none", 3, True), ("margin_mse", "model", 1, False)):
        out = tmp_path / loss
        cfg = config(tiny_model, beir, out, {"loss.kind": loss, "loss.teacher_scores": str(tmp_path / "teacher.tsv"),
                     "negatives.mine": negatives, "negatives.count": n, "negatives.depth": 6, "optim.max_steps": 2,
                     "optim.separate_towers": separate})
        trainer = Trainer(cfg)
        trainer.run()
        rows = [json.loads(x) for x in (out / "log.jsonl").read_text().splitlines()]
        assert len(rows) == 2 and all(math.isfinite(r["loss"]) for r in rows)
        for batch in epoch_batches(trainer.data, cfg, 0):
            for e in batch:
                assert len(e.negatives) == n and not set(e.negatives) & trainer.data.positives[e.qid]
    assert (tmp_path / "margin_mse" / "negatives" / "epoch-0.json").is_file()  # mined by the model itself
    from lsr.encode.splade.encoder import SpladeEncoder

    enc = SpladeEncoder.from_pretrained(tmp_path / "kl" / "model", device="cpu")  # query + document routes
    assert enc.describe()["query_model"] is not None
    assert not torch.equal(enc._towers["query"].weight, enc._towers["doc"].weight)  # trained apart


def test_losses_against_hand_computation():
    q = torch.tensor([[1.0, 0.0, 2.0], [0.0, 1.0, 0.0]])
    d = torch.tensor([[1.0, 0.0, 0.0], [0.0, 2.0, 0.0], [0.0, 0.0, 1.0], [1.0, 1.0, 0.0]])  # 2 pos, 1 neg each
    # scores q0: [1, 0, 2, 1], q1: [0, 2, 0, 1]
    lse = lambda xs: math.log(sum(math.exp(x) for x in xs))  # noqa: E731
    want = ((lse([1, 0, 2, 1]) - 1) + (lse([0, 2, 0, 1]) - 2)) / 2
    assert losses.info_nce(q, d).item() == pytest.approx(want, rel=1e-6)
    own = ((lse([1, 2]) - 1) + (lse([2, 1]) - 2)) / 2  # each query: its positive and its own negative
    assert losses.info_nce(q, d, in_batch=False).item() == pytest.approx(own, rel=1e-6)
    excl = torch.zeros(2, 4, dtype=torch.bool)
    excl[0, 2] = True
    want_ex = ((lse([1, 0, 1]) - 1) + (lse([0, 2, 0, 1]) - 2)) / 2
    assert losses.info_nce(q, d, exclude=excl).item() == pytest.approx(want_ex, rel=1e-6)
    teacher = torch.tensor([[3.0, 1.0], [0.0, 0.5]])  # margins 2, -0.5; student margins 1-2=-1, 2-1=1
    assert losses.margin_mse(q, d, teacher).item() == pytest.approx(((-1 - 2) ** 2 + (1 + 0.5) ** 2) / 2)
    p = torch.softmax(teacher, 1)
    s = torch.log_softmax(torch.tensor([[1.0, 2.0], [2.0, 1.0]]), 1)
    want_kl = float((p * (p.log() - s)).sum() / 2)
    assert losses.kl_distillation(q, d, teacher).item() == pytest.approx(want_kl, rel=1e-5)
    assert losses.flops(q).item() == pytest.approx(0.5 ** 2 + 0.5 ** 2 + 1.0 ** 2)
    assert losses.l1(q).item() == pytest.approx((3 + 1) / 2)
    assert losses.flops_weight(0.4, 5, 10) == pytest.approx(0.1) and losses.flops_weight(0.4, 12, 10) == 0.4


def test_cli_trains_and_resumes(tiny_model, beir, tmp_path, capsys):
    path = tmp_path / "c.yaml"
    out = tmp_path / "o"
    path.write_text(f"output: {out}\nencoder:\n  model: {tiny_model}\n  max_length_doc: 32\n  max_length_query: 16\n"
                    f"  head: torch\ndata:\n  dataset: {beir}\nnegatives:\n  count: 0\noptim:\n  batch_size: 4\n"
                    "schedule:\n  progress: false\n  save_every: 1\n")
    assert cli_main(["train", str(path), "--device", "cpu", "--set", "optim.max_steps=1"]) == 0
    assert f"trained model written to {out / 'model'}" in capsys.readouterr().out
    assert cli_main(["train", str(path), "--device", "cpu", "--set", "optim.max_steps=2", "--resume", "auto"]) == 0
    assert [json.loads(x)["step"] for x in (out / "log.jsonl").read_text().splitlines()] == [1, 2]
    assert cli_main(["train", str(path), "--device", "cpu", "--set", "optim.max_steps=1"]) == 1  # a finished run
    assert "holds an earlier run" in capsys.readouterr().err
    assert cli_main(["train", str(path), "--device", "cpu", "--set", "optim.max_steps=1", "--overwrite"]) == 0
    assert [json.loads(x)["step"] for x in (out / "log.jsonl").read_text().splitlines()] == [1]


def test_cli_train_explain_prints_the_plans_and_trains_nothing(tiny_model, beir, tmp_path, capsys):
    path = tmp_path / "c.yaml"
    out = tmp_path / "o"
    path.write_text(f"output: {out}\nencoder:\n  model: {tiny_model}\n  head: torch\ndata:\n  dataset: {beir}\n"
                    "negatives:\n  count: 0\noptim:\n  batch_size: 4\n")
    assert cli_main(["train", str(path), "--device", "cpu", "--explain"]) == 0
    text = capsys.readouterr().out
    assert text.count("encode plan: ") == 2 and ", doc batches\n" in text and ", query batches\n" in text
    assert "\n  head      torch  (" in text and "\n  backward  torch autograd" in text   # as training runs it
    assert text.rstrip().endswith("train plan\n  step  eager  (optim.cuda_graph=auto: off, the device is cpu "
                                  "(CUDA graphs need a GPU))")
    assert not out.exists(), "--explain trains and writes nothing"


@pytest.mark.parametrize("override, needle", [
    ("optim.lr=-1", "config.optim.lr must be > 0, got -1"),
    ("loss.kind=hinge", "config.loss.kind must be one of infonce, margin_mse, kl, got 'hinge'"),
    ("bogus=1", "unknown key(s) in config: ['bogus']"),
    ("max_steps=3", "did you mean optim.max_steps?"),
    ("optim.bogus=1", "unknown key(s) in config.optim: ['bogus']"),
    ("optim.batch_size=two", "config.optim.batch_size must be int, got 'two'"),
    ("optim.batch_size=0", "config.optim.batch_size must be >= 1, got 0"),
    ("encoder.head=cuda", "config.encoder.head must be one of auto, triton, torch"),
    ("encoder.dtype=float16", "training autocasts in bfloat16 or runs in float32"),
    ("loss.kind=kl", "set config.loss.teacher_scores"),
    ("optim=5", "config.optim must be a mapping"),
])
def test_config_errors_are_one_line_usage_errors(tiny_model, beir, tmp_path, capsys, override, needle):
    path = tmp_path / "c.yaml"
    path.write_text(f"output: {tmp_path / 'o'}\nencoder:\n  model: {tiny_model}\ndata:\n  dataset: {beir}\n")
    assert cli_main(["train", str(path), "--set", override]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and "\n" not in err


@pytest.mark.parametrize("where", ["user_folder", "dataset_folder"])
def test_output_that_is_not_lsr_trains_is_refused_untouched(tiny_model, beir, tmp_path, capsys, where):
    # a folder holding only the user's config.yaml, or the dataset itself: nothing of theirs is replaced
    # and nothing is written beside it
    if where == "user_folder":
        out = tmp_path / "mine"
        out.mkdir()
        (out / "config.yaml").write_text("my own notes\n")
    else:
        out = beir
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    path = tmp_path / "c.yaml"
    path.write_text(f"output: {out}\ndevice: cpu\nencoder:\n  model: {tiny_model}\ndata:\n  dataset: {beir}\n"
                    "negatives:\n  count: 0\n")
    assert cli_main(["train", str(path)]) == 1
    err = capsys.readouterr().err.strip()
    assert str(out) in err and "\n" not in err
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


def test_shipped_train_configs_load():
    from lsr.train.config import load_train_config
    from tests.conftest import REPO

    paths = sorted((REPO / "configs").glob("train-*.yaml"))
    assert paths
    for p in paths:
        cfg = load_train_config(p, ["optim.max_steps=2"])
        assert cfg.optim.max_steps == 2 and cfg.data.dataset and cfg.encoder.model


def test_triton_head_gives_the_torch_head_gradient(tiny_model, beir, tmp_path):
    """One batch through the Triton Sparton head (the interpreter on a CPU) and through the torch twin:
    the same loss and the same parameter gradients within fp32 rounding."""
    import os

    from lsr.train.data import epoch_batches

    pytest.importorskip("triton")
    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("needs CUDA or TRITON_INTERPRET=1")
    kw = {"optim.max_steps": 1, "optim.batch_size": 3, "encoder.max_length_doc": 16, "encoder.max_length_query": 8,
          "encoder.dtype": "float32", "device": "cuda" if torch.cuda.is_available() else "cpu"}
    out = []
    for head in ("triton", "torch"):
        trainer = Trainer(config(tiny_model, beir, tmp_path / head, {"encoder.head": head, **kw}))
        trainer.model.eval()  # no dropout
        batch = epoch_batches(trainer.data, trainer.cfg, 0)[0]
        loss, *_ = trainer.model.backward(_batch_loss(trainer, batch), [trainer.data.queries[e.qid] for e in batch],
                                          [trainer.data.docs[e.positive] for e in batch])
        out.append((float(loss), [p.grad for _, p in trainer.model.named_parameters()]))
    assert out[0][0] == pytest.approx(out[1][0], rel=1e-5)
    for got, want in zip(out[0][1], out[1][1], strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


@pytest.mark.gpu
def test_triton_deterministic_head_gives_identical_weights(tiny_model, beir, tmp_path):
    kw = {"optim.max_steps": 3, "optim.deterministic": True, "encoder.head": "triton", "device": "cuda"}
    a, b = (weights(train(config(tiny_model, beir, tmp_path / f"g{i}", kw))) for i in range(2))
    assert all(torch.equal(a[k], b[k]) for k in a)
