"""Parquet vector shards: round trips, resumable writing and corruption checks."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from lsr.shards import ShardWriter, iter_shards, read_manifest, read_vectors, write_vectors
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
