"""Messages that named the wrong thing or leaked (issue 48): each bad input is one line on stderr naming the file,
flag or value the user gave and the fix, with the documented exit code and no traceback."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

from lsr.cli import main
from tests.conftest import REPO
from tests.pipeline.test_faults_files import _UNDER_THE_FILE_LIMIT, _beir, _fails, job  # noqa: F401 - job: a fixture


@pytest.fixture
def fitted(job):  # noqa: F811 - job: test_faults_files' fixture
    """``job`` with dataset A encoded (BM25 fitted: vec/encoder) and indexed (idx)."""
    assert main(["encode", "--dataset", "A", "--out", "vec", "--device", "cpu"]) == 0
    assert main(["index", "--vectors", "vec", "--out", "idx", "--device", "cpu"]) == 0
    return job


# ---------------------------------------------------------------------------------------- a full disk
@pytest.mark.slow
def test_a_full_disk_while_encoding_is_one_line_and_no_traceback(job):  # noqa: F811 - job: test_faults_files' fixture
    """The shard writer fails, and fails again when the run lists what it finished: the second report of the same
    error was a logged traceback (three chained ones) above the one line."""
    rng = np.random.default_rng(0)   # shards well past the process's file size limit
    _beir(job / "big", {f"d{i}": " ".join(f"w{j}" for j in rng.integers(0, 4000, 3000)) for i in range(3)}, "d0")
    assert main(["encode", "--dataset", "big", "--out", "bigvec", "--device", "cpu"]) == 0
    argv = "encode --dataset big --out vec2 --device cpu --model bigvec/encoder"
    done = subprocess.run([sys.executable, "-c", _UNDER_THE_FILE_LIMIT, argv], cwd=job, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})
    lines = [line for line in done.stderr.splitlines() if line.strip() and not line.startswith("encode")]  # bars
    assert lines == ["lsr encode: error: the file size limit (ulimit -f) was reached writing vec2/part-00000.parquet: "
                     "raise it or choose another --out", "exit 1"], done.stderr


# ---------------------------------------------------------------------------------------- an unwritable --out
def _unwritable_folder(tmp: Path) -> Path:
    """A folder this process cannot create files in: a read-only one of its own, else (root writes in any folder
    of a plain file system) /sys, where nobody may create files."""
    read_only = tmp / "read-only"
    read_only.mkdir(mode=0o555)
    for folder in (read_only, Path("/sys")):
        try:
            fd, name = tempfile.mkstemp(dir=folder)
        except OSError:
            return folder
        os.close(fd)
        os.unlink(name)
    pytest.skip("no folder here refuses new files")


@pytest.mark.parametrize("command", ["search --index idx --queries A --model vec/encoder --device cpu --out",
                                     "index --vectors vec --device cpu --out"])
def test_an_unwritable_out_names_the_out_path_not_its_temporary(fitted, capsys, command):
    out = str(_unwritable_folder(fitted) / "result")
    line = _fails(capsys, [*command.split(), out], 1, f"writing --out {out}: ", "choose another --out")
    assert ".tmp" not in line


# ---------------------------------------------------------------------------------------- damaged encode folders
@pytest.mark.parametrize("file, text, said", [
    ("plan.json", "garbage", "is not valid JSON"),
    ("plan.json", "[1]", "holds list, not the plan"),
    ("shards/part-00000.json", '{"file": "part-00000.parquet", "rows": ', "is not valid JSON"),
    ("shards/part-00000.json", "[1]", "must be a JSON object"),
])
def test_a_damaged_file_of_an_unfinished_encoding_is_named(fitted, capsys, file, text, said):
    work = fitted / "out2" / ".lsr-encode"
    (work / file).parent.mkdir(parents=True)
    (work / file).write_text(text)
    _fails(capsys, ["encode", "--dataset", "A", "--out", "out2", "--model", "vec/encoder", "--device", "cpu"], 1,
           f"out2/.lsr-encode/{file}", said)
    assert not (fitted / "out2" / "manifest.json").exists()


def _edit_rows(manifest: Path, shard: int, rows: int, **more) -> dict:
    m = json.loads(manifest.read_text())
    m["n_rows"] += rows - m["shards"][shard]["rows"]   # the totals still add up: only the files can tell
    m["shards"][shard]["rows"] = rows
    manifest.write_text(json.dumps({**m, **more}))
    return m


def test_an_edited_row_count_is_refused_before_it_is_published(fitted, capsys):
    """A shard's entry (the manifest's, or the .json a distributed encoding keeps beside a finished shard) edited to
    another row count: refused naming the entry and the shard, before a manifest lists it (``lsr index`` used to
    be the first to notice)."""
    argv = ["encode", "--dataset", "A", "--model", "vec/encoder", "--shard-rows", "1", "--device", "cpu", "--out"]
    assert main([*argv, "ref"]) == 0
    capsys.readouterr()
    shards = fitted / "dist" / ".lsr-encode" / "shards"   # shard 1 finished by a rank, then its entry edited
    shards.mkdir(parents=True)
    shutil.copy(fitted / "ref" / "part-00001.parquet", shards)
    entry = json.loads((fitted / "ref" / "manifest.json").read_text())["shards"][1]
    (shards / "part-00001.json").write_text(json.dumps({**entry, "rows": 2}))
    _fails(capsys, [*argv, "dist"], 1, "dist/.lsr-encode/shards/part-00001.json says shard part-00001.parquet holds 2 "
           "rows, but dist/.lsr-encode/shards/part-00001.parquet holds 1")
    assert not (fitted / "dist" / "manifest.json").exists()
    for name, more in (("complete", {}), ("unfinished", {"complete": False})):   # rerun / resume one process
        shutil.copytree(fitted / "ref", fitted / name)
        _edit_rows(fitted / name / "manifest.json", 0, 3, **more)
        _fails(capsys, [*argv, name], 1, f"{name}/manifest.json says shard part-00000.parquet holds 3 rows, but "
               f"{name}/part-00000.parquet holds 1")


# ---------------------------------------------------------------------------------------- datasets
def test_a_fake_parquet_corpus_is_named(job, capsys):  # noqa: F811 - job: test_faults_files' fixture
    (job / "fake.parquet").write_text("not a parquet file\n")
    _fails(capsys, ["encode", "--dataset", "fake.parquet", "--out", "v", "--device", "cpu"], 1,
           "fake.parquet is not a readable Parquet file")
    pytest.importorskip("datasets")
    _fails(capsys, ["encode", "--dataset", "A/corpus.jsonl?queries=fake.parquet", "--out", "v", "--device", "cpu"], 1,
           "fake.parquet is not a readable Parquet file")


@pytest.mark.parametrize("argv, named", [
    (["--dataset", "data/nosuch:test"], "'data/nosuch' is not an existing folder"),
    (["--dataset", "data/nosuch", "--split", "test"], "'data/nosuch' is not an existing folder"),
    (["--dataset", "./nosuch:test"], "'./nosuch' is not a dataset folder (it does not exist)"),
])
def test_a_missing_dataset_folder_is_named_without_the_split(job, capsys, argv, named):  # noqa: F811 - job: test_faults_files' fixture
    pytest.importorskip("ir_datasets")
    _fails(capsys, ["encode", *argv, "--out", "v", "--device", "cpu"], 1, named)


# ---------------------------------------------------------------------------------------- BM25 flags
def test_a_bm25_search_without_model_names_the_flag_and_the_command_that_makes_one(fitted, capsys):
    line = _fails(capsys, ["search", "--index", "idx", "--queries", "A", "--out", "r.trec", "--device", "cpu"], 2,
                  "--model FOLDER", "lsr encode")
    assert "fit(" not in line and not (fitted / "r.trec").exists()


@pytest.mark.parametrize("argv", [
    "encode --dataset A --out v2 --device cpu --attention causal",
    "encode --dataset A --what queries --model vec/encoder --out q2 --device cpu --attention bidirectional",
    "search --index idx --queries A --model vec/encoder --out r.trec --device cpu --attention causal"])
def test_attention_with_bm25_is_a_usage_error(fitted, capsys, argv):
    _fails(capsys, argv.split(), 2, "--attention", "BM25")
    assert not any((fitted / name).exists() for name in ("v2", "q2", "r.trec"))
