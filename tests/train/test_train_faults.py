"""lsr train against damaged checkpoints, changed configs and more negatives than it has to draw from.

A damaged newest checkpoint under ``resume: auto`` is skipped with a warning naming the file, for the one
before it (and the run then ends with the uninterrupted run's weights); resuming with a changed lr / batch size
/ model / loss warns once per changed key; ``negatives.count`` beyond what can be drawn without repeats is
refused before any work, or topped up with distinct random documents (with a warning) where a query's mined
candidates are fewer.
"""

from __future__ import annotations

import json
import logging
import shutil

import pytest
import torch

from lsr.cli import main as cli_main
from lsr.train.data import Example, TrainData, epoch_batches
from lsr.train.trainer import train
from tests.train.test_train import config, weights  # (the tiny_model and beir fixtures: tests/train/conftest.py)

STEPS = {"optim.max_steps": 4, "schedule.save_every": 2, "schedule.keep_checkpoints": None,
         "optim.deterministic": True}


@pytest.fixture(scope="module")
def finished(tiny_model, beir, tmp_path_factory):  # noqa: F811 - fixtures from test_train
    """A 4-step run with checkpoints at steps 2 and 4, and its final weights."""
    out = tmp_path_factory.mktemp("finished") / "run"
    final = weights(train(config(tiny_model, beir, out, STEPS)))
    return out, final


def _copy(finished, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(finished[0], out)
    return out, out / "checkpoints" / "step-00000002", out / "checkpoints" / "step-00000004"


def _truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["model.safetensors", "trainer_state/state.json"])
def test_a_damaged_newest_checkpoint_is_skipped_for_the_one_before(tiny_model, beir, finished, tmp_path, caplog,  # noqa: F811
                                                                    damage):
    out, step2, step4 = _copy(finished, tmp_path)
    _truncate(step4 / damage)
    with caplog.at_level(logging.WARNING, logger="lsr.train"):
        path = train(config(tiny_model, beir, out, {"resume": "auto", **STEPS}))
    skipped = [r.getMessage() for r in caplog.records if "skipping checkpoint" in r.getMessage()]
    assert len(skipped) == 1 and str(step4 / damage) in skipped[0]
    assert [json.loads(x)["step"] for x in (out / "log.jsonl").read_text().splitlines()] == [1, 2, 3, 4]
    got = weights(path)   # steps 3 and 4 redone from step 2: the uninterrupted run's weights
    assert all(torch.equal(got[k], finished[1][k]) for k in got)


@pytest.mark.slow
def test_a_checkpoint_from_a_newer_lsr_is_refused_naming_its_state_file(tiny_model, beir, finished, tmp_path):  # noqa: F811
    out, step2, step4 = _copy(finished, tmp_path)
    state = step4 / "trainer_state" / "state.json"
    doc = json.loads(state.read_text())
    assert doc["format_version"] == 1
    state.write_text(json.dumps({**doc, "format_version": 9}))
    with pytest.raises(ValueError, match=f"{state} was written by a newer lsr \\(format version 9\\)"):
        train(config(tiny_model, beir, out, {"resume": str(step4), **STEPS}))


@pytest.mark.slow   # (the shared 4-step run is built by the first of these tests to run)
def test_no_usable_checkpoint_or_a_damaged_named_one_is_a_one_line_error(tiny_model, beir, finished, tmp_path,  # noqa: F811
                                                                         capsys):
    out, step2, step4 = _copy(finished, tmp_path)
    _truncate(step4 / "model.safetensors")
    (step2 / "trainer_state" / "state.json").write_text("{not json")
    path = tmp_path / "c.yaml"
    path.write_text(f"output: {out}\ndevice: cpu\nencoder:\n  model: {tiny_model}\n  head: torch\ndata:\n"
                    f"  dataset: {beir}\nnegatives:\n  count: 0\nschedule:\n  progress: false\n")
    assert cli_main(["train", str(path), "--resume", "auto"]) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "no usable checkpoint" in err and str(step4 / "model.safetensors") in err
    assert str(step2 / "trainer_state" / "state.json") in err
    assert step2.is_dir() and step4.is_dir()   # nothing of the run is deleted
    assert cli_main(["train", str(path), "--resume", str(step4)]) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"cannot resume from {step4}" in err and str(step4 / "model.safetensors") in err


@pytest.mark.slow
def test_resuming_with_a_changed_config_warns_once_per_changed_key(tiny_model, beir, finished, tmp_path, caplog):  # noqa: F811
    out, step2, _ = _copy(finished, tmp_path)
    # (another global batch is refused, not warned about: tests/train/test_distributed_train.py)
    changed = {**STEPS, "optim.max_steps": 3, "optim.lr": 1e-3, "loss.kind": "infonce",
               "loss.temperature": 0.5, "resume": str(step2)}
    with caplog.at_level(logging.WARNING, logger="lsr.train"):
        train(config(tiny_model, beir, tmp_path / "resumed", changed))
    lines = [r.getMessage() for r in caplog.records if "changed config" in r.getMessage()]
    keys = sorted(line.split("changed config: ")[1].split(":")[0] for line in lines)
    assert keys == ["loss.temperature", "optim.lr", "optim.max_steps"]
    assert any("optim.lr: 0.003 -> 0.001" in line for line in lines)


@pytest.mark.parametrize("override, needle", [
    ("negatives.count=60", "config.negatives.count (60) must be <= negatives.depth - negatives.skip (50 - 0)"),
    ("negatives.skip=8", "config.negatives.count (4) must be <= negatives.depth - negatives.skip (10 - 8)"),
])
def test_more_negatives_than_mining_gives_is_refused_at_config_load(tiny_model, beir, tmp_path, capsys,  # noqa: F811
                                                                    override, needle):
    path = tmp_path / "c.yaml"
    depth = "" if "count" in override else "  count: 4\n  depth: 10\n"
    path.write_text(f"output: {tmp_path / 'o'}\nencoder:\n  model: {tiny_model}\ndata:\n  dataset: {beir}\n"
                    f"negatives:\n  mine: bm25\n{depth}")
    assert cli_main(["train", str(path), "--set", override]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and "\n" not in err and not (tmp_path / "o").exists()


def test_fewer_candidates_than_count_gives_distinct_negatives_and_a_warning(tiny_model, beir, tmp_path, caplog):  # noqa: F811
    docs = {f"d{i}": f"text {i}" for i in range(8)}
    data = TrainData({"q0": "a", "q1": "b"}, docs, [("q0", "d0"), ("q1", "d1")], {"q0": {"d0"}, "q1": {"d1", "d2"}},
                     candidates={"q0": ["d3"], "q1": ["d4", "d5", "d6"]})
    cfg = config(tiny_model, beir, tmp_path / "o", {"negatives.count": 3, "negatives.mine": "bm25",
                                                    "optim.batch_size": 2})
    with caplog.at_level(logging.WARNING, logger="lsr.train"):
        examples: list[Example] = [e for b in epoch_batches(data, cfg, 0) for e in b]
    by_q = {e.qid: e.negatives for e in examples}
    assert len(set(by_q["q0"])) == 3 and "d3" in by_q["q0"] and "d0" not in by_q["q0"]   # d3, then 2 random
    assert sorted(by_q["q1"]) == ["d4", "d5", "d6"]
    assert any("1 queries (e.g. 'q0') have fewer than negatives.count=3" in r.getMessage() for r in caplog.records)
    cfg = config(tiny_model, beir, tmp_path / "o", {"negatives.count": 8, "negatives.mine": "bm25",
                                                    "negatives.depth": 8, "optim.batch_size": 2})
    with pytest.raises(ValueError, match="negatives.count is 8 but query 'q[01]' has only [67] documents"):
        epoch_batches(data, cfg, 0)


def test_a_triples_line_with_fewer_negatives_than_count_is_refused(tiny_model, beir, tmp_path):  # noqa: F811
    path = tmp_path / "triples.tsv"
    path.write_text("q one\tpos one\tneg a\tneg b\nq two\tpos two\tneg c\tneg c\n")
    with pytest.raises(ValueError, match=r"triples.tsv:2: 1 distinct negative\(s\), fewer than negatives.count=2"):
        train(config(tiny_model, beir, tmp_path / "o", {"data.dataset": None, "triples": str(path),
                                                        "negatives.count": 2, "optim.max_steps": 1}))


@pytest.mark.slow
def test_a_log_line_cut_short_by_a_kill_does_not_stop_a_resume(tiny_model, beir, finished, tmp_path, caplog):  # noqa: F811
    out, _, _ = _copy(finished, tmp_path)
    with open(out / "log.jsonl", "a", encoding="utf-8") as f:
        f.write('{"step": 5, "lo')   # a kill while the line was written
    with caplog.at_level(logging.WARNING, logger="lsr.train"):
        train(config(tiny_model, beir, out, {"resume": "auto", **STEPS}))
    assert [json.loads(x)["step"] for x in (out / "log.jsonl").read_text().splitlines()] == [1, 2, 3, 4]
    assert any("log.jsonl:5: dropping a line cut short" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("line, needle", [("q1\td2\tnan", "not a finite number"),
                                          ("q1\td1\t2.0", "a second score for query 'q1' and document 'd1'")])
def test_teacher_scores_refuse_nan_and_repeated_pairs_naming_the_line(tmp_path, line, needle):
    from lsr.train.data import read_teacher_scores

    path = tmp_path / "teacher.tsv"
    path.write_text(f"q1\td1\t1.5\n{line}\n")
    with pytest.raises(ValueError, match=f"teacher.tsv:2: .*{needle}"):
        read_teacher_scores(str(path))
