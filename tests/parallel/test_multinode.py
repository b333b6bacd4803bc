"""Across hosts: ``torchrun --nnodes 2 --nproc-per-node 2 --rdzv-backend c10d`` (two agents started side by side on
this machine, as two hosts would start them), gloo on the CPU, running ``python -m lsr search`` and ``lsr run``:
byte for byte what one process writes. No launch or rendezvous code of lsr's: torchrun's environment only."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from lsr.cli import main
from lsr.index import InvertedIndex
from lsr.storage.shards import write_vectors
from lsr.testing import free_port, random_collection, write_scifact_slice
from tests.conftest import REPO

NODES, PER_NODE, TIMEOUT_S = 2, 2, 300


def _two_nodes(tmp: Path, name: str, lsr_args: list[str]) -> list[subprocess.CompletedProcess]:
    """Both agents of a 2-node job (node ranks assigned by the rendezvous), run to completion."""
    port = free_port()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(NODES), "--nproc-per-node", str(PER_NODE),
           "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", name,
           "-m", "lsr", *lsr_args]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    agents = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp)
              for _ in range(NODES)]
    done = []
    try:
        for a in agents:
            out, err = a.communicate(timeout=TIMEOUT_S)
            done.append(subprocess.CompletedProcess(cmd, a.returncode, out, err))
    finally:
        for a in agents:
            a.kill()
    return done


@pytest.mark.slow
def test_two_nodes_of_two_ranks_equal_one_process(tmp_path, data_dir):
    docs = random_collection(70, 40, 11, density=0.15, quantized=True)
    write_vectors(tmp_path / "q", random_collection(13, 40, 12, density=0.2, quantized=True))
    InvertedIndex.build(docs, block_size=16).save(tmp_path / "plain")
    search = ["search", "--queries", str(tmp_path / "q"), "--k", "30", "--device", "cpu", "--backend", "torch"]
    # a plain index: 4 replicas over the 2 nodes, each rank a quarter of the queries
    nodes = _two_nodes(tmp_path, "search", [*search, "--index", str(tmp_path / "plain"), "--out",
                                            str(tmp_path / "nodes.trec")])
    assert [n.returncode for n in nodes] == [0, 0], [n.stderr[-2000:] for n in nodes]
    assert sum(n.stdout.count("searched 13 queries") for n in nodes) == 1  # global rank 0 alone reports
    assert main([*search, "--index", str(tmp_path / "plain"), "--out", str(tmp_path / "one.trec")]) == 0
    assert (tmp_path / "nodes.trec").read_bytes() == (tmp_path / "one.trec").read_bytes()

    write_scifact_slice(tmp_path / "scifact", data_dir)
    (tmp_path / "job.yaml").write_text(f"name: nodes\ndata:\n  dataset: {tmp_path / 'scifact'}\nencoder:\n  kind: bm25\n"
                                       "evaluation:\n  metrics: [nDCG@10, R@20]\n")
    common = ["--set", "device=cpu", "--set", "encoder.shard_rows=12", "--set", "index.block_size=16",
              "--set", "search.k=20", "--set", "search.backend=torch"]
    nodes = _two_nodes(tmp_path, "run", ["run", str(tmp_path / "job.yaml"), "--set", f"output={tmp_path / 'nodes'}",
                                         *common])
    assert [n.returncode for n in nodes] == [0, 0], [n.stderr[-2000:] for n in nodes]
    assert main(["run", str(tmp_path / "job.yaml"), "--set", f"output={tmp_path / 'one'}", *common]) == 0
    for f in ("run.trec", "run.msmarco.tsv"):
        assert (tmp_path / "nodes" / f).read_bytes() == (tmp_path / "one" / f).read_bytes(), f
