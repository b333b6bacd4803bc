"""Parquet vector shards: round trips, resumable writing and corruption checks."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from lsr.storage.shard_writer import ShardWriter
from lsr.storage.shards import iter_shards, read_manifest, read_vector_rows, read_vectors, write_vectors
from lsr.testing import random_collection


def test_round_trip_in_several_shards(tmp_path):
    v = random_collection(23, 64, seed=4)
    manifest = write_vectors(tmp_path / "vec", v, {"model": "m", "max_length": 7}, shard_rows=5)
    assert [s["rows"] for s in manifest["shards"]] == [5, 5, 5, 5, 3]
    assert manifest["complete"] and manifest["n_rows"] == 23 and manifest["nnz"] == v.nnz
    back = read_vectors(tmp_path / "vec")
    assert back.equal(v)
    assert sum(len(s) for s in iter_shards(tmp_path / "vec")) == 23
    table = pq.read_table(tmp_path / "vec" / "part-00000.parquet")
    assert table.column_names == ["id", "indices", "values"]
    import pyarrow as pa

    assert table.schema.field("indices").type.value_type == pa.int32()
    assert table.schema.field("values").type.value_type == pa.float32()


def test_resume_continues_without_loss_or_duplicates(tmp_path):
    v = random_collection(30, 64, seed=5)
    w = ShardWriter(tmp_path / "vec", 64, {"m": 1}, shard_rows=7)
    w.add(v[:10])
    w.add(v[10:16])  # 14 rows complete in 2 shards, 2 buffered rows are lost with the "crash"
    del w
    assert not read_manifest(tmp_path / "vec")["complete"]
    with pytest.raises(ValueError, match="unfinished"):
        read_vectors(tmp_path / "vec")
    with pytest.raises(FileExistsError):
        ShardWriter(tmp_path / "vec", 64, {"m": 1}, shard_rows=7)
    with pytest.raises(ValueError, match="other settings"):
        ShardWriter(tmp_path / "vec", 64, {"m": 2}, shard_rows=7, resume=True)
    w = ShardWriter(tmp_path / "vec", 64, {"m": 1}, shard_rows=7, resume=True)
    assert w.rows_done == 14
    w.add(v[w.rows_done:])
    w.close()
    assert read_vectors(tmp_path / "vec").equal(v)


def test_parallel_shard_writes_give_the_same_directory(tmp_path):
    v = random_collection(40, 64, seed=7)
    one = write_vectors(tmp_path / "one", v, {"m": 1}, shard_rows=6)
    w = ShardWriter(tmp_path / "two", 64, {"m": 1}, shard_rows=6, write_threads=3)
    for start in range(0, 40, 9):
        w.add(v[start:start + 9])
    w.settle()  # what a run stopped by an error does: every shard handed over is listed, in order
    assert read_manifest(tmp_path / "two")["shards"] == one["shards"][:6]
    assert w.close() == one
    assert read_vectors(tmp_path / "two").equal(v)


def test_corrupt_or_missing_shards_are_rejected(tmp_path):
    v = random_collection(12, 32, seed=6)
    write_vectors(tmp_path / "vec", v, shard_rows=4)
    f = tmp_path / "vec" / "part-00001.parquet"
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0xFF
    f.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="checksum"):
        read_vectors(tmp_path / "vec")
    f.unlink()
    with pytest.raises(FileNotFoundError, match="missing"):
        read_vectors(tmp_path / "vec")
    (tmp_path / "vec" / "manifest.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        read_vectors(tmp_path / "vec")
    with pytest.raises(FileNotFoundError, match="manifest"):
        read_vectors(tmp_path)


def test_shard_with_invalid_vectors_is_rejected(tmp_path):
    v = random_collection(4, 16, seed=7)
    write_vectors(tmp_path / "vec", v, shard_rows=10)
    m = json.loads((tmp_path / "vec" / "manifest.json").read_text())
    m["vocab_size"] = 2  # the stored term ids no longer fit the declared vocabulary
    (tmp_path / "vec" / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        read_vectors(tmp_path / "vec")


def test_a_writer_refuses_vectors_of_another_vocabulary(tmp_path):
    v = random_collection(4, 16, seed=7)
    w = ShardWriter(tmp_path / "vec", v.vocab_size + 1, shard_rows=10)
    with pytest.raises(ValueError, match=rf"vocabulary size {v.vocab_size} cannot join .* is {v.vocab_size + 1}"):
        w.add(v)
    w.add(random_collection(3, v.vocab_size + 1, seed=8))
    w.close()
    assert read_vectors(tmp_path / "vec").vocab_size == v.vocab_size + 1


def test_row_groups_stream_into_the_same_files_however_rows_arrive(tmp_path):
    v = random_collection(50, 64, seed=8)
    one = ShardWriter(tmp_path / "one", 64, {"m": 1}, shard_rows=12, row_group_rows=5)
    one.add(v)
    ref = one.close()
    assert [s["rows"] for s in ref["shards"]] == [12, 12, 12, 12, 2]
    meta = pq.read_metadata(tmp_path / "one" / "part-00000.parquet")
    assert [meta.row_group(i).num_rows for i in range(meta.num_row_groups)] == [5, 5, 2]
    for threads, step in ((1, 7), (3, 4), (4, 1)):
        w = ShardWriter(tmp_path / f"t{threads}", 64, {"m": 1}, shard_rows=12, write_threads=threads,
                        row_group_rows=5)
        for start in range(0, 50, step):
            w.add(v[start:start + step])
        assert w.close() == ref
    assert read_vectors(tmp_path / "t3").equal(v)


def test_settle_drops_a_half_written_shard(tmp_path):
    v = random_collection(30, 64, seed=9)
    w = ShardWriter(tmp_path / "vec", 64, {"m": 1}, shard_rows=12, write_threads=2, row_group_rows=4)
    w.add(v[:20])  # shard 0 complete, shard 1 has two of its three row groups
    w.settle()  # what a run stopped by an error does
    assert [s["rows"] for s in read_manifest(tmp_path / "vec")["shards"]] == [12]
    assert sorted(p.name for p in (tmp_path / "vec").iterdir()) == ["manifest.json", "part-00000.parquet"]
    w = ShardWriter(tmp_path / "vec", 64, {"m": 1}, shard_rows=12, resume=True, row_group_rows=4)
    w.add(v[w.rows_done:])
    w.close()
    assert read_vectors(tmp_path / "vec").equal(v)


def test_a_failed_shard_write_raises_and_leaves_no_file(tmp_path, monkeypatch):
    import lsr.storage.shard_writer as writer

    v = random_collection(30, 64, seed=10)
    real = writer.vectors_to_table

    def flaky(vectors):
        if vectors.ids[0] == v.ids[8]:  # shard 1's first row group
            raise OSError("disk full")
        return real(vectors)

    monkeypatch.setattr(writer, "vectors_to_table", flaky)
    w = ShardWriter(tmp_path / "vec", 64, {"m": 1}, shard_rows=8, write_threads=2, row_group_rows=4)
    with pytest.raises(RuntimeError, match="disk full"):
        w.add(v[:24])
        w.close()
    assert [s["rows"] for s in read_manifest(tmp_path / "vec")["shards"]] == [8]
    assert not [p for p in (tmp_path / "vec").iterdir() if p.name.endswith(".tmp") or p.name == "part-00001.parquet"]


def _drop_shard(vec, k):
    """Hide shard k as a hand edit would: its entry gone and the totals made to add up again."""
    m = json.loads((vec / "manifest.json").read_text())
    gone = m["shards"].pop(k)
    m["n_rows"] -= gone["rows"]
    m["nnz"] -= gone["nnz"]
    (vec / "manifest.json").write_text(json.dumps(m))
    return gone["file"]


@pytest.mark.parametrize("k", [1, 2])  # a middle shard, the last one
def test_a_shard_the_manifest_does_not_list_is_refused(tmp_path, capsys, k):
    from lsr.cli import main

    vec = tmp_path / "vec"
    v = random_collection(12, 32, seed=11)
    write_vectors(vec, v, shard_rows=4)
    name = _drop_shard(vec, k)
    for read in (lambda: read_vectors(vec), lambda: list(iter_shards(vec)), lambda: read_vector_rows(vec, 0, 4)):
        with pytest.raises(ValueError, match=f"holds the shard file {name}, which its manifest.json does not list"
                           ) as e:
            read()
        assert "\n" not in str(e.value) and "restore the manifest" in str(e.value)
    assert main(["index", "--vectors", str(vec), "--out", str(tmp_path / "idx"), "--device", "cpu"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and name in err and "Traceback" not in err and not (tmp_path / "idx").exists()
    (vec / name).unlink()  # as the message says: the folder then loads the rows its manifest lists
    (vec / f".{name}.123-abc.tmp").write_bytes(b"")  # a writer's temporary file is not a shard
    assert len(read_vectors(vec)) == 8


def test_a_resume_removes_the_shards_a_killed_writer_finished_ahead(tmp_path):
    """Write threads finish shards out of order: a kill can leave part-00002 on disk with only part-00000
    listed. A resume that ends with fewer shards (a larger shard_rows) must not leave it behind as a shard
    the readers refuse; a complete folder's unlisted shard is no leftover and is kept for them to report."""
    vec = tmp_path / "vec"
    v = random_collection(12, 32, seed=12)
    write_vectors(vec, v, {"m": 1}, shard_rows=4)
    m = read_manifest(vec)
    m.update(shards=m["shards"][:1], n_rows=4, nnz=m["shards"][0]["nnz"], complete=False)
    (vec / "manifest.json").write_text(json.dumps(m))
    w = ShardWriter(vec, 32, {"m": 1}, shard_rows=8, resume=True)
    w.add(v[w.rows_done:])
    w.close()
    assert sorted(p.name for p in vec.iterdir()) == ["manifest.json", "part-00000.parquet", "part-00001.parquet"]
    assert read_vectors(vec).equal(v)
    (vec / "manifest.json").unlink()  # killed before the first shard was listed: all of them are leftovers
    w = ShardWriter(vec, 32, {"m": 1}, shard_rows=12, resume=True)
    w.add(v)
    w.close()
    assert read_vectors(vec).equal(v) and not (vec / "part-00001.parquet").exists()
    write_vectors(tmp_path / "done", v, {"m": 1}, shard_rows=4)
    name = _drop_shard(tmp_path / "done", 2)
    ShardWriter(tmp_path / "done", 32, {"m": 1}, shard_rows=4, resume=True).close()
    assert (tmp_path / "done" / name).exists()
    with pytest.raises(ValueError, match="does not list"):
        read_vectors(tmp_path / "done")
