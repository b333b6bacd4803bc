"""The sharded index (lsr.index.sharded): build / load / validation, the partitions' collection-wide term maxima,
the refusals (bad manifests, unlisted or swapped partitions, more partitions than documents), and ``lsr index
--partitions`` searched like one index."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from lsr.cli import main
from lsr.index import InvertedIndex
from lsr.index.sharded import ShardedIndex, check_partition_count, partition_bounds
from lsr.storage.shards import read_vector_rows, read_vectors, write_vectors
from lsr.testing import random_collection


def _collection(n=90, vocab=50, seed=3):
    docs = random_collection(n, vocab, seed, density=0.15, quantized=True)  # many exact ties
    queries = random_collection(12, vocab, seed + 100, density=0.2, quantized=True)
    return docs, queries


def _corrupt(path, edit):
    mf = path / "manifest.json"
    m = json.loads(mf.read_text())
    edit(m)
    mf.write_text(json.dumps(m))


def test_partition_bounds():
    assert partition_bounds(10, 3) == [0, 3, 6, 10]
    assert partition_bounds(2, 4) == [0, 0, 1, 1, 2]
    with pytest.raises(ValueError, match="positive integer"):
        partition_bounds(10, 0)


def test_read_vector_rows_matches_slices(tmp_path):
    docs, _ = _collection()
    write_vectors(tmp_path / "v", docs, shard_rows=7)
    for a, b in [(0, 90), (5, 6), (7, 14), (13, 71), (90, 90)]:
        assert read_vector_rows(tmp_path / "v", a, b).equal(docs[a:b])
    with pytest.raises(ValueError, match="outside"):
        read_vector_rows(tmp_path / "v", 3, 91)


def test_global_max_scores_installed(tmp_path):
    docs, _ = _collection()
    ShardedIndex.build(docs, 3, tmp_path / "idx", block_size=16)
    sharded = ShardedIndex.load(tmp_path / "idx")
    single = InvertedIndex.build(docs, block_size=16)
    for part in sharded.partitions:
        assert torch.equal(part.max_scores, single.max_scores)


def test_partial_load_and_docnos(tmp_path):
    docs, _ = _collection()
    ShardedIndex.build(docs, 3, tmp_path / "idx")
    one = ShardedIndex.load(tmp_path / "idx", partitions=[1])
    assert one.partitions[0] is None and one.partitions[1].n_docs == 30
    assert one.docnos == docs.ids  # read from the partitions' docno files
    with pytest.raises(ValueError, match="partitions 0..2"):
        ShardedIndex.load(tmp_path / "idx", partitions=[3])


@pytest.mark.parametrize("edit,match", [
    (lambda m: m.update(format="lsr-index"), "is not 'lsr-sharded-index'"),
    (lambda m: m.update(version=99), r"written by a newer lsr \(format version 99\)"),
    (lambda m: m["partitions"][1].update(doc_start=31), "do not tile"),
    (lambda m: m.update(n_docs=91), "do not tile"),
    (lambda m: m["partitions"][0].pop("dir"), "missing or bad entry"),
    (lambda m: m["partitions"][1].update(dir="../x"), "distinct plain names"),
    (lambda m: m.update(partitions=[]), "no partitions"),
    (lambda m: m["partitions"][0].update(meta_sha256="0" * 64), "does not match the sharded manifest"),
    (lambda m: m["max_scores"].update(sha256="0" * 64), "fails its sha256"),
])
def test_bad_manifests_give_one_line_errors(tmp_path, edit, match):
    docs, _ = _collection()
    ShardedIndex.build(docs, 3, tmp_path / "idx")
    _corrupt(tmp_path / "idx", edit)
    with pytest.raises(ValueError, match=match) as e:
        ShardedIndex.load(tmp_path / "idx")
    assert "\n" not in str(e.value)


def test_a_partition_the_manifest_does_not_list_is_refused(tmp_path, capsys):
    docs, queries = _collection()
    write_vectors(tmp_path / "q", queries)
    ShardedIndex.build(docs, 3, tmp_path / "idx")

    def drop_last(m):  # as a hand edit would: the entry gone, the totals made to tile the docs again
        gone = m["partitions"].pop()
        m["n_docs"] -= gone["n_docs"]
        m["n_postings"] -= gone["n_postings"]

    _corrupt(tmp_path / "idx", drop_last)
    with pytest.raises(ValueError, match="holds the partition part-00002, which its manifest.json does not list") as e:
        ShardedIndex.load(tmp_path / "idx")
    assert "\n" not in str(e.value) and "restore the manifest" in str(e.value)
    out = tmp_path / "x.trec"
    assert main(["search", "--index", str(tmp_path / "idx"), "--queries", str(tmp_path / "q"), "--out", str(out),
                 "--device", "cpu"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "part-00002" in err and "Traceback" not in err and not out.exists()
    shutil.rmtree(tmp_path / "idx" / "part-00002")  # removed: the index of the listed partitions loads
    assert ShardedIndex.load(tmp_path / "idx").n_docs == 60


def test_more_partitions_than_documents_is_refused_before_any_work(tmp_path, capsys):
    docs, _ = _collection(n=4)
    write_vectors(tmp_path / "v", docs)
    assert main(["index", "--vectors", str(tmp_path / "v"), "--out", str(tmp_path / "idx"), "--partitions", "7",
                 "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "7 partitions asked for the 4 documents of" in err and "at most 4" in err
    assert not (tmp_path / "idx").exists() and not list(tmp_path.glob("*.tmp-*"))
    with pytest.raises(ValueError, match="at most 4"):  # the library refuses alike, before writing anything
        ShardedIndex.build(docs, 5, tmp_path / "idx")
    assert not (tmp_path / "idx").exists()
    assert main(["index", "--vectors", str(tmp_path / "v"), "--out", str(tmp_path / "idx"), "--partitions", "4",
                 "--device", "cpu"]) == 0  # one document per partition is allowed
    assert [p.n_docs for p in ShardedIndex.load(tmp_path / "idx").partitions] == [1, 1, 1, 1]
    assert (check_partition_count(4, 4), check_partition_count(90, 3), check_partition_count(0, 1)) == (4, 3, 1)
    with pytest.raises(ValueError, match="at most 1"):
        check_partition_count(0, 2)
    with pytest.raises(ValueError, match="positive integer"):
        check_partition_count(4, 0)


def test_swapped_partition_and_stale_max_scores(tmp_path):
    docs, _ = _collection()
    ShardedIndex.build(docs, 2, tmp_path / "idx")
    np.save(tmp_path / "idx" / "max_scores.npy", np.zeros(50, np.float32))
    with pytest.raises(ValueError, match="below partition 0's term maxima"):
        ShardedIndex.load(tmp_path / "idx", verify=False)
    with pytest.raises(FileExistsError, match="--overwrite"):
        ShardedIndex.build(docs, 2, tmp_path / "idx")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="refusing to overwrite"):
        ShardedIndex.build(docs, 2, tmp_path / "other", overwrite=True)


def test_cli_index_partitions_and_search(tmp_path, capsys):
    docs, queries = _collection()
    write_vectors(tmp_path / "v", docs, shard_rows=13)
    write_vectors(tmp_path / "q", queries)
    assert main(["index", "--vectors", str(tmp_path / "v"), "--out", str(tmp_path / "idx"), "--partitions", "3",
                 "--device", "cpu"]) == 0
    assert main(["index", "--vectors", str(tmp_path / "v"), "--out", str(tmp_path / "one"), "--device", "cpu"]) == 0
    for idx in ("idx", "one"):
        assert main(["search", "--index", str(tmp_path / idx), "--queries", str(tmp_path / "q"), "--k", "9",
                     "--out", str(tmp_path / f"{idx}.trec"), "--device", "cpu", "--backend", "torch"]) == 0
    assert (tmp_path / "idx.trec").read_text() == (tmp_path / "one.trec").read_text()
    assert main(["index", "--vectors", str(tmp_path / "v"), "--out", str(tmp_path / "bad"), "--partitions", "0",
                 "--device", "cpu"]) == 2
    assert "--partitions" in capsys.readouterr().err
    _corrupt(tmp_path / "idx", lambda m: m["partitions"][2].update(n_docs=1))
    assert main(["search", "--index", str(tmp_path / "idx"), "--queries", str(tmp_path / "q"), "--out",
                 str(tmp_path / "x.trec"), "--device", "cpu"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "do not tile" in err and not (tmp_path / "x.trec").exists()
    assert read_vectors(tmp_path / "v").equal(docs)
