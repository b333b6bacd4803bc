"""The CUDA-graph training step (``optim.cuda_graph``, ``lsr.train.graph_step``).

CPU: the route decision (auto off on a CPU, ``on`` refused where it cannot run, incompatible keys refused,
YAML's on / off), the bucketed, padded step run uncaptured equals the eager step (loss, log fields, weights),
checkpoints of an optimizer with a tensor learning rate. GPU (``gpu``): eager and graph training give the same
loss curve with two document buckets captured and a short batch uncaptured, resume from a graph checkpoint
(on the graph and on the eager route), a non-finite loss leaves the weights untouched.

    python -m pytest -q -n 0 tests/train/test_graph_step.py        # on a GPU machine: the gpu tests run too
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from lsr.cli import main as cli_main
from lsr.train.config import LossConfig, train_config_from_dict
from lsr.train.graph_step import DOC_BUCKET, GraphStep, doc_width, plan_train_step
from lsr.train.trainer import Trainer, train
from tests.train.test_train import with_changes

SHORT, MIDDLE, LONG = 12, 80, 150  # words of the train documents: three length groups (see ``varied``)


def config(model, dataset, out, changes=None):
    """A small training config; ``changes``: {dotted key: value}, as ``--set`` gives them."""
    base = {"output": str(out), "device": "cpu", "seed": 3,
            "encoder": {"model": str(model), "max_length_query": 16, "max_length_doc": 128, "head": "torch"},
            "data": {"dataset": str(dataset), "split": "train"}, "negatives": {"count": 0},
            "loss": {"flops_query": 1e-3, "flops_doc": 1e-3, "flops_warmup_steps": 4},
            "optim": {"batch_size": 4, "lr": 1e-3, "warmup_steps": 2},
            "schedule": {"progress": False, "log_every": 1}}
    return train_config_from_dict(with_changes(base, changes))


@pytest.fixture(scope="module")
def varied(tmp_path_factory, data_dir):
    """A BEIR folder whose train documents fall into length groups: queries 0-4 have SHORT-word documents,
    5-9 MIDDLE, 10-11 LONG (truncated at 128 tokens); query i = the title of document i, judged relevant to
    it; 12-15 are the dev split."""
    root = tmp_path_factory.mktemp("varied")
    with open(data_dir / "scifact" / "corpus.jsonl", encoding="utf-8") as f:
        rows = [json.loads(line) for line, _ in zip(f, range(16))]
    words = [SHORT] * 5 + [MIDDLE] * 5 + [LONG] * 6
    with open(root / "corpus.jsonl", "w") as f:
        for r, n in zip(rows, words):
            f.write(json.dumps({"_id": r["_id"], "title": "", "text": " ".join((r["text"].split() * 4)[:n])}) + "\n")
    with open(root / "queries.jsonl", "w") as f:
        for i, r in enumerate(rows):
            f.write(json.dumps({"_id": f"q{i}", "text": r["title"]}) + "\n")
    (root / "qrels").mkdir()
    for split, ids in (("train", range(12)), ("dev", range(12, 16))):
        lines = ["query-id\tcorpus-id\tscore"] + [f"q{i}\t{rows[i]['_id']}\t1" for i in ids]
        (root / "qrels" / f"{split}.tsv").write_text("\n".join(lines) + "\n")
    teacher = [f"q{i}\t{r['_id']}\t{10.0 if i == j else (i * 7 + j) % 5}" for i in range(12) for j, r in enumerate(rows)]
    (root / "teacher.tsv").write_text("\n".join(teacher) + "\n")
    return root


# ---------------------------------------------------------------------------------------------- the route


def test_auto_is_eager_on_a_cpu_and_graph_on_one_gpu(tiny_model, varied, tmp_path, caplog):
    cfg = config(tiny_model, varied, tmp_path / "o")
    assert cfg.optim.cuda_graph == "auto"
    plan = plan_train_step(cfg, "cpu", distributed=False)
    assert not plan.graph and "the device is cpu" in str(plan) and str(plan).startswith("train plan\n  step  eager")
    plan = plan_train_step(cfg, "cuda", distributed=False)  # (a plan reads the device's name only)
    assert plan.graph and "CUDA graph" in str(plan)
    assert "torchrun" in plan_train_step(cfg, "cuda", distributed=True).reason
    assert not plan_train_step(config(tiny_model, varied, tmp_path / "o", {"optim.cuda_graph": "off"}), "cuda",
                               distributed=False).graph
    trainer = Trainer(config(tiny_model, varied, tmp_path / "t", {"optim.max_steps": 1}))  # auto on a CPU
    assert not trainer.step_plan.graph and trainer.graph_step is None
    with caplog.at_level("INFO", logger="lsr.train"):
        trainer.run()
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("train plan:")]
    assert said == ["train plan: step eager (optim.cuda_graph=auto: off, the device is cpu (CUDA graphs need a GPU))"]


@pytest.mark.parametrize("key, value, why", [
    ("optim.deterministic", True, "optim.deterministic is true"),
    ("optim.grad_cache_chunk", 2, "optim.grad_cache_chunk is set"),
    ("optim.gradient_checkpointing", True, "optim.gradient_checkpointing is true"),
    ("loss.in_batch_groups", 2, "loss.in_batch_groups > 1"),
])
def test_incompatible_keys_turn_auto_off_and_refuse_on(tiny_model, varied, tmp_path, key, value, why):
    plan = plan_train_step(config(tiny_model, varied, tmp_path / "o", {key: value}), "cuda", distributed=False)
    assert not plan.graph and why in plan.reason
    with pytest.raises(ValueError, match=r"config\.optim\.cuda_graph=on cannot run: " + why.replace(".", r"\.")):
        config(tiny_model, varied, tmp_path / "o", {key: value, "optim.cuda_graph": "on"})


def test_on_where_it_cannot_run_is_a_one_line_usage_error(tiny_model, varied, tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text(f"output: {tmp_path / 'o'}\nencoder:\n  model: {tiny_model}\ndata:\n  dataset: {varied}\n"
                    "negatives:\n  count: 0\n")
    for sets, needle in ((["optim.cuda_graph=on", "device=cpu"], "the device is cpu (CUDA graphs need a GPU)"),
                         (["optim.cuda_graph=on", "optim.deterministic=true"], "optim.deterministic is true"),
                         (["optim.cuda_graph=sometimes"], "config.optim.cuda_graph must be auto, on or off"),
                         (["optim.cuda_graph=2"], "config.optim.cuda_graph must be str or bool, got 2")):
        assert cli_main(["train", str(path), *(a for s in sets for a in ("--set", s))]) == 2, sets
        err = capsys.readouterr().err.strip()
        assert needle in err and "\n" not in err, (sets, err)
        if "=on" in sets[0]:
            assert "config.optim.cuda_graph=on cannot run" in err
    assert not (tmp_path / "o").exists()  # refused before anything is written


def test_yaml_on_off_and_strings_read_as_modes(tiny_model, varied, tmp_path):
    from lsr.train.config import load_train_config

    path = tmp_path / "c.yaml"
    path.write_text(f"output: {tmp_path / 'o'}\nencoder:\n  model: {tiny_model}\ndata:\n  dataset: {varied}\n"
                    "negatives:\n  count: 0\noptim:\n  cuda_graph: off\n")
    assert load_train_config(path).optim.cuda_graph_mode == "off"  # YAML 1.1: off is false
    for value, mode in (("on", "on"), ("true", "on"), ("false", "off"), ("auto", "auto"), ("'off'", "off")):
        assert load_train_config(path, [f"optim.cuda_graph={value}"]).optim.cuda_graph_mode == mode


def test_doc_width_buckets():
    assert DOC_BUCKET == 64
    assert [doc_width(n, 256) for n in (1, 63, 64, 65, 200, 256)] == [64, 64, 64, 128, 256, 256]
    assert doc_width(100, 100) == 100 and doc_width(0, 256) == 64  # capped at max_length_doc; never empty


# ---------------------------------------------------------------------------------------------- the step


@pytest.mark.parametrize("kind", ["infonce", "kl"])
def test_padded_step_equals_the_eager_step(tiny_model, varied, tmp_path, kind):
    """The graph route's step, run uncaptured on a CPU (queries padded to max_length_query, documents to
    their bucket, device-tensor loss inputs, foreach clipping) gives the eager step's loss, log fields,
    gradient norm and weights within fp32 rounding, at a step inside the FLOPS warm-up."""
    from lsr.train.data import epoch_batches
    from lsr.train.trainer import lr_factor

    extra = {} if kind == "infonce" else {"loss.kind": "kl", "loss.teacher_scores": str(varied / "teacher.tsv"),
                                          "negatives.count": 2}
    eager = Trainer(config(tiny_model, varied, tmp_path / "eager", {"optim.max_steps": 5, **extra}))
    graph = Trainer(config(tiny_model, varied, tmp_path / "graph", {"optim.max_steps": 5, **extra}))
    for t in (eager, graph):
        t.model.eval()  # no dropout: both see the same network
        t.step = 2
    batch = epoch_batches(eager.data, eager.cfg, 0)[1]
    initial = [p.detach().clone() for _, p in graph.model.named_parameters()]
    row = eager.train_step(batch)
    step = GraphStep(graph.model, graph.optimizer, graph.cfg.loss, graph.cfg.optim.max_grad_norm, graphs=False)
    inputs, _ = step.batch_inputs(graph.data, batch, 2)
    assert inputs.q_ids.shape[1] == 16 and inputs.d_ids.shape[1] % DOC_BUCKET == 0  # padded past the longest
    lr = graph.cfg.optim.lr * lr_factor(2, graph.cfg.optim.warmup_steps, graph.total_steps)
    loss, logs, grad_norm, counts = step.run(graph.data, batch, 2, lr)
    assert row["lr"] == lr and 0 < logs["flops_weight_q"] == row["flops_weight_q"] < 1e-3  # mid warm-up
    assert loss == pytest.approx(row["loss"], rel=1e-5)
    for key in ("rank_loss", "flops_q", "flops_d"):
        assert logs[key] == pytest.approx(row[key], rel=1e-4), key
    assert grad_norm == pytest.approx(row["grad_norm"], rel=1e-4)
    assert counts["nnz_q"] / counts["n_q"] == pytest.approx(row["nnz_q"], abs=0.5)
    assert counts["nnz_d"] / counts["n_d"] == pytest.approx(row["nnz_d"], abs=0.5)
    pairs = zip(eager.model.named_parameters(), graph.model.named_parameters(), initial, strict=True)
    for (name, a), (_, b), start in pairs:
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6, msg=name)
    assert sum(not torch.equal(b, start) for (_, b), start in zip(graph.model.named_parameters(), initial)) > 10


def test_checkpoint_of_a_tensor_learning_rate_keeps_the_runs_own_optimizer(tmp_path):
    """A graph step's AdamW holds its learning rate as a tensor: it saves as a number, and a run that loads a
    checkpoint keeps its own implementation flags and learning-rate object (the checkpoint's may differ)."""
    from lsr.train.state import load_trainer_state, save_trainer_state

    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(3, 2)), torch.nn.Parameter(torch.randn(2))]
    lr = torch.tensor(1e-2)
    saved = torch.optim.AdamW(params, lr=lr, foreach=False)
    for p in params:
        p.grad = torch.ones_like(p)
    saved.step()
    save_trainer_state(tmp_path / "ckpt", saved, ["w", "b"], torch.device("cpu"), {"step": 1})
    groups = json.loads((tmp_path / "ckpt" / "trainer_state" / "state.json").read_text())["param_groups"]
    assert groups[0]["lr"] == pytest.approx(1e-2) and groups[0]["foreach"] is False
    loaded = torch.optim.AdamW(params, lr=5e-3, foreach=True)
    load_trainer_state(tmp_path / "ckpt", loaded, ["w", "b"], torch.device("cpu"))
    assert loaded.param_groups[0]["foreach"] is True and loaded.param_groups[0]["lr"] == 5e-3
    for p in params:
        torch.testing.assert_close(loaded.state[p]["exp_avg"], saved.state[p]["exp_avg"])


# ---------------------------------------------------------------------------------------------- on a GPU


def _log(out):
    return [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]


def _assert_same_curve(got, want, rel):
    assert [r["step"] for r in got] == [r["step"] for r in want]
    for a, b in zip(got, want, strict=True):
        assert a["lr"] == b["lr"] and a["flops_weight_d"] == b["flops_weight_d"]
        for key in ("loss", "rank_loss", "grad_norm"):
            assert a[key] == pytest.approx(b[key], rel=rel), (a["step"], key, a[key], b[key])


# fp32 (no autocast): the routes differ only in summation order (compiled backbone, padded widths), ~1e-6
# relative per step; AdamW's normalised updates carry that through 9 steps far below 1e-3, while a stale
# learning rate or FLOPS weight, unmasked padding or gradients not zeroed between replays move the loss by
# percent at lr 1e-3
GPU_TOLERANCE = 1e-3


@pytest.mark.gpu
@pytest.mark.slow
def test_graph_training_gives_the_eager_loss_curve_and_resumes(splade_tiny_no_dropout, varied, tmp_path):
    base = {"device": "cuda", "encoder.dtype": "float32", "encoder.head": "auto", "optim.batch_size": 5,
            "optim.max_steps": 9, "schedule.save_every": 3, "schedule.keep_checkpoints": None}
    eager_out, graph_out = tmp_path / "eager", tmp_path / "graph"
    train(config(splade_tiny_no_dropout, varied, eager_out, {**base, "optim.cuda_graph": "off"}))
    trainer = Trainer(config(splade_tiny_no_dropout, varied, graph_out, {**base, "optim.cuda_graph": "on"}))
    trainer.run()
    assert trainer.step_plan.graph
    # 12 pairs in batches of 5 sorted by length: 5 SHORT-word documents (bucket 64), 5 MIDDLE (128),
    # and a short batch of 2 that runs uncaptured
    widths = sorted(d[1] for _, d in trainer.graph_step.captured)
    assert widths == [64, 128], trainer.graph_step.captured
    eager_log, graph_log = _log(eager_out), _log(graph_out)
    assert len(graph_log) == 9 and all(math.isfinite(r["loss"]) for r in graph_log)
    assert set(graph_log[0]) == set(eager_log[0])  # the same log fields
    _assert_same_curve(graph_log, eager_log, GPU_TOLERANCE)
    ckpt = graph_out / "checkpoints" / "step-00000003"
    for route in ("on", "off"):  # a graph checkpoint resumes on both routes
        out = tmp_path / f"resumed-{route}"
        train(config(splade_tiny_no_dropout, varied, out, {**base, "optim.cuda_graph": route, "resume": str(ckpt)}))
        _assert_same_curve(_log(out), graph_log[3:], GPU_TOLERANCE)


@pytest.mark.gpu
def test_a_non_finite_loss_leaves_the_weights_untouched(splade_tiny_no_dropout):
    from lsr.encode.splade.encoder import SpladeEncoder
    from lsr.train.batch_loss import LossInputs
    from lsr.train.graph_step import StepInputs
    from lsr.train.model import TrainableEncoder, adamw_kernel

    enc = SpladeEncoder.from_pretrained(splade_tiny_no_dropout, device="cuda", dtype=torch.float32, varlen=False,
                                        compile=True)
    model = TrainableEncoder(enc, bf16=False).train()
    optimizer = torch.optim.AdamW([p for _, p in model.named_parameters()], lr=1e-3,
                                  **adamw_kernel("cuda", capturable=True))
    step = GraphStep(model, optimizer, LossConfig(kind="kl"), 1.0)
    g = torch.Generator().manual_seed(0)
    ids = {n: torch.randint(1000, 30000, (n, 16), generator=g) for n in (2, 4)}
    masks = {n: torch.ones(n, 16, dtype=torch.long) for n in (2, 4)}
    teacher = torch.tensor([[1.0, float("nan")], [0.5, 0.0]])
    inputs = StepInputs(ids[2], masks[2], ids[4], masks[4], LossInputs(torch.zeros(2, 4, dtype=torch.bool), teacher,
                                                                       1e-3, 1e-3))
    before = [p.detach().clone() for p in step.params]
    for _ in range(3):  # warm-up (a real step), capture, replay
        out = step.step_tensors(inputs, 1e-3).tolist()
        assert math.isnan(out[0])
        for p, b in zip(step.params, before, strict=True):
            assert torch.equal(p, b)
    assert step.captured and all(float(optimizer.state[p]["step"]) == 0 for p in step.params)
