"""SIGKILL at several points of ``lsr run`` and ``lsr index``, then a rerun: the rerun's files equal an
uninterrupted run's byte for byte, nothing the killed process left behind survives, and a killed
``--overwrite`` swap leaves the old index readable (rolled back) until a rerun replaces it."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import pytest
import torch

from lsr.cli import main
from lsr.index.inverted import InvertedIndex
from lsr.sparse import SparseVectors
from lsr.storage.shards import write_vectors
from tests.conftest import REPO

# The child runs ``lsr.cli.main(argv)`` and kills itself with SIGKILL at the ``nth`` rename / replace /
# link whose destination is named ``target``: the moment a file or folder would be published.
CHILD = """
import os, signal, sys
target, nth, argv = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
seen = [0]
def killing(real):
    def publish(src, dst, *a, **k):
        if os.path.basename(os.fspath(dst)) == target:
            seen[0] += 1
            if seen[0] == nth:
                os.kill(os.getpid(), signal.SIGKILL)
        return real(src, dst, *a, **k)
    return publish
os.replace, os.rename, os.link = killing(os.replace), killing(os.rename), killing(os.link)
from lsr.cli import main
sys.exit(main(argv))
"""


def _lsr(argv, kill_at=None, nth=1):
    target = kill_at or "-"
    proc = subprocess.run([sys.executable, "-c", CHILD, target, str(nth), *argv], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    errors = [line for line in proc.stderr.splitlines() if line.strip() and not line.startswith("encode")]
    return proc.returncode, "\n".join(errors)  # stderr without the progress bars


def _tree(folder):
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    root = tmp_path_factory.mktemp("killjob")
    data = root / "data"
    (data / "qrels").mkdir(parents=True)
    words = ["apple", "banana", "cherry", "pear", "plum", "apple pie", "banana bread"]
    (data / "corpus.jsonl").write_text("".join(json.dumps({"_id": f"d{i}", "text": f"{w} {i}"}) + "\n"
                                               for i, w in enumerate(words)))
    (data / "queries.jsonl").write_text("".join(json.dumps({"_id": f"q{i}", "text": w}) + "\n"
                                                for i, w in enumerate(["apple", "banana"])))
    (data / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq0\td5\t1\nq1\td1\t1\n")
    cfg = root / "cfg.yaml"
    cfg.write_text(f"name: k\ndata:\n  dataset: {data}\ndevice: cpu\nencoder:\n  shard_rows: 2\nsearch:\n  k: 5\n"
                   "evaluation:\n  metrics: [RR@10, nDCG@10]\n")
    reference = root / "reference"
    assert main(["run", str(cfg), "--set", f"output={reference}"]) == 0
    return cfg, reference


def _comparable(out):
    tree = _tree(out)
    metrics = json.loads((out / "metrics.json").read_text())
    tree.pop("metrics.json")
    tree.pop("config.yaml")  # names the output folder
    tree.pop(".lsr-run.json")
    return tree, metrics["metrics"]


@pytest.mark.parametrize("kill_at, nth", [("part-00001.parquet", 1), ("index", 1), ("run.trec", 1)])
def test_lsr_run_killed_then_rerun_equals_an_uninterrupted_run(job, tmp_path, kill_at, nth):
    cfg, reference = job
    out = tmp_path / "out"
    code, _ = _lsr(["run", str(cfg), "--set", f"output={out}"], kill_at, nth)
    assert code == -9
    assert main(["run", str(cfg), "--set", f"output={out}"]) == 0
    assert _comparable(out) == _comparable(reference)
    leftovers = [p.name for p in out.rglob("*") if ".tmp" in p.name or ".old-" in p.name]
    assert leftovers == []  # the killed process's temporaries were removed by the rerun


def _vectors(tmp_path, name, seed):
    g = torch.Generator().manual_seed(seed)
    dense = torch.rand(6, 9, generator=g) * (torch.rand(6, 9, generator=g) < 0.5)
    path = tmp_path / name
    write_vectors(path, SparseVectors.from_dense(dense, ids=[f"d{i}" for i in range(6)]))
    return path


@pytest.mark.slow
def test_lsr_index_killed_while_publishing_and_during_an_overwrite_swap(tmp_path, capsys):
    old_vec, new_vec = _vectors(tmp_path, "old", 1), _vectors(tmp_path, "new", 2)
    idx = tmp_path / "idx"
    index = ["index", "--device", "cpu", "--out", str(idx), "--vectors"]
    code, _ = _lsr([*index, str(old_vec)], "idx")  # killed at the publish of a new index
    assert code == -9 and not idx.exists()
    assert main([*index, str(old_vec)]) == 0
    old_tree = _tree(idx)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["idx", "new", "old"]

    code, _ = _lsr([*index, str(new_vec), "--overwrite"], "idx")  # killed between the two renames
    assert code == -9 and not idx.exists()
    assert InvertedIndex.load(idx).n_docs == 6 and _tree(idx) == old_tree  # rolled back by the reader
    assert sorted(p.name for p in tmp_path.iterdir()) == ["idx", "new", "old"]
    capsys.readouterr()
    assert main([*index, str(new_vec)]) == 1 and "already exists" in capsys.readouterr().err
    assert _tree(idx) == old_tree
    assert main([*index, str(new_vec), "--overwrite"]) == 0
    assert _tree(idx) != old_tree and InvertedIndex.load(idx).docs.equal(
        InvertedIndex.build(new_vec, device="cpu").docs)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["idx", "new", "old"]
