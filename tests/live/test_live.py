"""Live indexes (lsr.live): random sequences of adds, upserts, deletes, compactions and reopenings search exactly
as an index rebuilt from scratch over the resulting documents (property test, both backends); the log's torn
tail and damaged records; the writer lock; refused updates leave nothing behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from lsr.index.inverted import InvertedIndex
from lsr.live import LiveIndex, LiveSearcher
from lsr.search import SearchConfig, Searcher
from lsr.search.filters import DocFilter
from lsr.sparse import SparseVectors
from tests.conftest import REPO

VOCAB = 30


def docs_of(ids: list[str], seed: int) -> SparseVectors:
    """Sparse vectors with quantized weights (tied scores) for ``ids``."""
    g = torch.Generator().manual_seed(seed)
    dense = (torch.rand(len(ids), VOCAB, generator=g) < 0.25) * torch.randint(1, 4, (len(ids), VOCAB), generator=g)
    dense[:, 0] += 1   # no empty document
    return SparseVectors.from_dense(dense.float(), ids=ids)


def queries(seed: int = 99) -> SparseVectors:
    return docs_of([f"q{i}" for i in range(8)], seed)


def rebuilt_run(live: LiveIndex, q: SparseVectors, k: int, backend: str, flt=None) -> dict:
    index = InvertedIndex.build(live.documents(), block_size=16)
    return Searcher(index, backend=backend).search_run(q, k, filter=flt)


def test_random_updates_search_as_a_rebuild(tmp_path):
    rng = np.random.default_rng(5)
    live = LiveIndex.create(tmp_path / "live", docs_of([f"d{i}" for i in range(40)], 0), block_size=16)
    next_id, q = 40, queries()
    for step in range(60):
        op = rng.choice(["add", "upsert", "delete", "compact", "reopen"], p=[0.3, 0.3, 0.25, 0.05, 0.1])
        current = live.documents().ids
        if op == "add":
            n = int(rng.integers(1, 6))
            live.add(docs_of([f"d{next_id + i}" for i in range(n)], step))
            next_id += n
        elif op == "upsert" and current:
            old = list(rng.choice(current, size=min(3, len(current)), replace=False))
            live.upsert(docs_of(old + [f"d{next_id}"], 1000 + step))
            next_id += 1
        elif op == "delete" and len(current) > 5:
            live.delete(list(rng.choice(current, size=3, replace=False)))
        elif op == "compact":
            live.compact()
        elif op == "reopen":
            live.close()
            live = LiveIndex.open(tmp_path / "live")
        if step % 6 == 5:
            for k in (5, 200):
                assert LiveSearcher(live).search_run(q, k) == rebuilt_run(live, q, k, "torch"), (step, k)
            deny = DocFilter.deny(live.documents().ids[::4])
            assert LiveSearcher(live).search_run(q, 10, filter=deny) == rebuilt_run(live, q, 10, "torch", deny)
    gpu = LiveSearcher(live, config=SearchConfig(backend="gpu")).search_run(q, 20)   # TRITON_INTERPRET on a CPU
    assert gpu == rebuilt_run(live, q, 20, "gpu")
    live.close()


def test_a_background_compaction_keeps_the_updates_made_meanwhile(tmp_path):
    live = LiveIndex.create(tmp_path / "live", docs_of([f"d{i}" for i in range(300)], 0), block_size=16)
    for j in range(12):   # more update batches than MAX_SEGMENTS: the delta parts are folded once
        live.upsert(docs_of([f"d{j}", f"n{j}"], j + 1))
    q = queries()
    thread = live.compact(background=True)
    with pytest.raises(RuntimeError, match="a compaction is running already"):
        live.compact()
    for j in range(12, 30):   # while it builds: updates and searches go on
        live.upsert(docs_of([f"d{j}", f"n{j}"], j + 1))
        live.delete([f"d{100 + j}"])
        assert LiveSearcher(live).search_run(q, 20) == rebuilt_run(live, q, 20, "torch"), j
    thread.join()
    assert live.generation == 1 and live.seq == 12 + 2 * 18
    assert LiveSearcher(live).search_run(q, 50) == rebuilt_run(live, q, 50, "torch")
    ids = live.documents().ids
    live.close()
    again = LiveIndex.open(tmp_path / "live")   # the updates made during the compaction are in the new log
    assert again.documents().ids == ids and again.seq == live.seq
    assert sorted(p.name for p in (tmp_path / "live").iterdir()) == [".lsr-live.lock", "base-000001", "live.json",
                                                                     "wal-000001.log"]
    again.close()


def test_refused_updates_write_nothing(tmp_path):
    live = LiveIndex.create(tmp_path / "live", docs_of(["a", "b", "c"], 0))
    size = os.path.getsize(tmp_path / "live" / "wal-000000.log")
    with pytest.raises(KeyError, match=r"1 docno\(s\) are in the index already \('b'\): use upsert"):
        live.add(docs_of(["x", "b"], 1))
    with pytest.raises(KeyError, match=r"1 docno\(s\) to delete are not in the index \('nope'\)"):
        live.delete(["a", "nope"])
    with pytest.raises(ValueError, match="vocab_size 7, the index 30"):
        live.add(SparseVectors.from_dense(torch.ones(1, 7), ids=["y"]))
    assert os.path.getsize(tmp_path / "live" / "wal-000000.log") == size and live.seq == 0
    assert live.delete(["a", "nope"], missing="ignore") == 1 and live.documents().ids == ["b", "c"]
    live.close()
    with pytest.raises(FileExistsError, match="already exists"):
        LiveIndex.create(tmp_path / "live", docs_of(["a"], 0))
    reader = LiveIndex.open(tmp_path / "live", write=False)
    with pytest.raises(ValueError, match="open it with write=True"):
        reader.delete(["b"])


def test_a_torn_last_record_is_dropped_and_a_damaged_one_refused(tmp_path):
    live = LiveIndex.create(tmp_path / "live", docs_of(["a", "b"], 0))
    live.add(docs_of(["c"], 1))
    live.add(docs_of(["d"], 2))
    live.close()
    wal = tmp_path / "live" / "wal-000000.log"
    whole = wal.read_bytes()
    wal.write_bytes(whole[:-5])   # a kill in the middle of the last append
    again = LiveIndex.open(tmp_path / "live")
    assert again.documents().ids == ["a", "b", "c"] and again.seq == 1
    again.add(docs_of(["e"], 3))   # the torn bytes were cut off: the log goes on cleanly
    again.close()
    assert LiveIndex.open(tmp_path / "live", write=False).documents().ids == ["a", "b", "c", "e"]
    data = bytearray(wal.read_bytes())
    data[30] ^= 0xFF   # inside the first record, with another after it
    wal.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"wal-000000.log: record 1 at byte 0 is damaged \(checksum\) and more follow"):
        LiveIndex.open(tmp_path / "live", write=False)


def test_a_second_writer_is_refused_naming_the_first(tmp_path):
    LiveIndex.create(tmp_path / "live", docs_of(["a"], 0)).close()
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from lsr.live import LiveIndex; live = LiveIndex.open(sys.argv[1]); "
        "print('open', flush=True); time.sleep(60)"), str(tmp_path / "live")],
        env=dict(os.environ, PYTHONPATH=str(REPO)), stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "open"
        with pytest.raises(FileExistsError, match=rf"is being written by another job \(pid {holder.pid} on host "):
            LiveIndex.open(tmp_path / "live")
        assert LiveIndex.open(tmp_path / "live", write=False).n_docs == 1   # readers are not refused
    finally:
        holder.kill()
        holder.wait()
    LiveIndex.open(tmp_path / "live").close()   # the holder is gone: its lock is taken over


CHILD = r"""
import hashlib, json, os, sys
import torch
from lsr.live import LiveIndex
from lsr.sparse import SparseVectors
from pathlib import Path

def doc(i):   # update i's document: a docno of 12, its weights from i
    g = torch.Generator().manual_seed(i)
    dense = (torch.rand(1, 30, generator=g) < 0.3) * torch.randint(1, 5, (1, 30), generator=g)
    dense[:, 0] += 1
    return SparseVectors.from_dense(dense.float(), ids=[f"d{i % 12}"])

def digest(d):
    blob = json.dumps([d.ids, d.indptr.tolist(), d.indices.tolist(), d.values.tolist()])
    return hashlib.sha256(blob.encode()).hexdigest()

def write(path):
    live = LiveIndex.open(path) if path.exists() else LiveIndex.create(path, doc(0))
    print("open", live.seq, digest(live.documents()), flush=True)
    i = live.seq
    while True:
        i += 1
        if i % 7 == 0:
            live.delete([f"d{i % 12}"], missing="ignore")
        else:
            live.upsert(doc(i))
        print("ack", live.seq, flush=True)
        if i % 25 == 0:
            live.compact()

# a zygote: torch is imported once, each writer is a fork of it (fork-safe: OMP_NUM_THREADS=1, nothing ran yet)
for line in sys.stdin:
    pid = os.fork()
    if pid == 0:
        write(Path(sys.argv[1]))
    print("pid", pid, flush=True)
    os.waitpid(pid, 0)
    print("reaped", flush=True)
"""


class Model:
    """CHILD's documents after n updates, advanced incrementally (insertion order: an upsert moves to the end)."""

    def __init__(self) -> None:
        self.ns: dict = {}
        exec(CHILD.split("# a zygote")[0], self.ns)   # doc(), digest() and write(), not the loop
        self.state, self.n = {"d0": self.ns["doc"](0)}, 0

    def digest(self, n: int) -> str:
        for i in range(self.n + 1, n + 1):
            self.state.pop(f"d{i % 12}", None)
            if i % 7:
                self.state[f"d{i % 12}"] = self.ns["doc"](i)
        self.n = n
        return self.ns["digest"](SparseVectors.concat(list(self.state.values())))


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "fork"), reason="the writers are forks of one process")
def test_no_acknowledged_update_is_lost_to_100_kills(tmp_path):
    """A writer SIGKILLed 100 times at random points (mid-append, mid-compaction, between updates): every reopen
    holds every update it acknowledged (at most one more, written but not yet acknowledged), and exactly the
    documents those updates make."""
    rng, model = np.random.default_rng(11), Model()
    path, acked = tmp_path / "live", 0
    zygote = subprocess.Popen([sys.executable, "-c", CHILD, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, env=dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1"))
    try:
        for kill in range(100):
            zygote.stdin.write("go\n")
            zygote.stdin.flush()
            lines = [zygote.stdout.readline(), zygote.stdout.readline()]   # "pid N" and the writer's "open ..."
            pid = int(next(ln for ln in lines if ln.startswith("pid ")).split()[1])
            opened = next(ln for ln in lines if ln.startswith("open ")).split()
            seq = int(opened[1])
            assert acked <= seq <= acked + 1, (kill, acked, seq)   # nothing acknowledged is lost
            assert opened[2] == model.digest(seq), kill
            acked = seq
            time.sleep(float(rng.uniform(0.0, 0.05)))   # then kill it wherever it is
            os.kill(pid, signal.SIGKILL)
            out = []
            while not (line := zygote.stdout.readline()).endswith("reaped\n"):   # (after a cut line: on its end)
                assert line, "the zygote ended"
                out.append(line)
            # (a line cut by the kill was not seen: its update counts as unacknowledged)
            acks = [int(ln[4:-1]) for ln in out if ln.startswith("ack ") and ln.endswith("\n") and ln[4:-1].isdigit()]
            acked = max([acked, *acks])
    finally:
        zygote.kill()
        zygote.wait()
    assert acked > 200   # the kills landed among real work


def test_docno_filters_name_live_documents_only(tmp_path):
    """A docno list is checked against the live documents, as a rebuilt index checks it: a deleted one is not in the
    index, and a replaced one's old slot does not count twice."""
    live = LiveIndex.create(tmp_path / "live", docs_of(["a", "b", "c", "d"], 0))
    live.delete(["b"])
    live.upsert(docs_of(["c"], 1))
    q, searcher = queries(), LiveSearcher(live)
    with pytest.raises(ValueError, match=r"1 docno\(s\) of the deny list are not in the index \('b'\)"):
        searcher.search(q, 3, filter=DocFilter.deny(["b"]))
    with pytest.raises(ValueError, match=r"\('zz'\)"):
        searcher.search(q, 3, filter=DocFilter.allow(["c", "zz"]))
    allow = DocFilter.allow(["c", "d"])
    assert searcher.search_run(q, 3, filter=allow) == rebuilt_run(live, q, 3, "torch", allow)


def test_texts_are_encoded_with_the_index_encoder(tmp_path, data_dir):
    """``add_texts`` with the real SPLADE model: the live documents are the vectors the encoder gives; an encoder
    the index was not built with is refused in one line."""
    import json

    from lsr.encode.splade.encoder import SpladeEncoder

    rows = [json.loads(line) for line in (data_dir / "scifact" / "corpus.jsonl").read_text().splitlines()[:12]]
    texts, ids = [r["title"] + " " + r["text"] for r in rows], [r["_id"] for r in rows]
    encoder = SpladeEncoder.from_pretrained(str(data_dir / "models" / "splade-tiny"), device="cpu")
    live = LiveIndex.create(tmp_path / "live", encoder.encode_document(texts[:8], ids=ids[:8]),
                            metadata=encoder.describe())
    live.add_texts(encoder, texts[8:], ids[8:])
    live.add_texts(encoder, texts[:1], ids[:1], replace=True)
    want = encoder.encode_document(texts[1:] + texts[:1], ids=ids[1:] + ids[:1])
    assert live.documents().equal(want)
    other = type("Other", (), {"describe": lambda self: {"model": "another/model"},
                               "encode_document": encoder.encode_document})()
    with pytest.raises(ValueError, match="this encoder is not the one the index was built with"):
        live.add_texts(other, texts[:1], ["new"])
    with pytest.raises(ValueError, match="2 texts for 1 docnos"):
        live.add_texts(encoder, texts[:2], ["x"])
    live.close()
