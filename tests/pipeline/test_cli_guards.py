"""Usage and input guards of the command line: each bad value or input is one line and exit 2 (usage) or 1
(runtime), before any work, and never a deleted user file or a silently wrong number (a session-19 audit)."""

from __future__ import annotations

import json

import pytest

from lsr.cli import main
from lsr.data.sources import read_qrels
from lsr.sparse import SparseVectors


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A 30-document BEIR folder, its BM25 vectors and index (CPU)."""
    root = tmp_path_factory.mktemp("guards")
    beir = root / "beir"
    (beir / "qrels").mkdir(parents=True)
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"]
    docs = [{"_id": f"d{i}", "title": "", "text": " ".join(words[j % 8] for j in range(i, i + 3 + i % 4))}
            for i in range(30)]
    (beir / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    (beir / "queries.jsonl").write_text("".join(json.dumps({"_id": f"q{i}", "text": words[i]}) + "\n" for i in range(5)))
    (beir / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(f"q{i}\td{i}\t1\n" for i in range(5)))
    vec, idx = root / "vec", root / "idx"
    assert main(["encode", "--dataset", str(beir), "--out", str(vec), "--device", "cpu"]) == 0
    assert main(["index", "--vectors", str(vec), "--out", str(idx), "--device", "cpu"]) == 0
    return {"root": root, "beir": beir, "vec": vec, "idx": idx}


def _err(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err   # one line
    return err


@pytest.mark.parametrize("argv,text", [
    (["search", "--index", "i", "--queries", "q", "--out", "o", "--k", "0"], "must be >= 1"),
    (["search", "--index", "i", "--queries", "q", "--out", "o", "--device", "gpu"], "unknown device"),
    (["search", "--index", "i", "--queries", "q", "--out", "o", "--batch-size", "-1"], "must be >= 1"),
    (["encode", "--dataset", "d", "--out", "o", "--shard-rows", "0"], "must be >= 1"),
    (["encode", "--dataset", "d", "--out", "o", "--max-length-query", "-5"], "must be >= 1"),
    (["index", "--vectors", "v", "--out", "o", "--block-size", "0"], "must be a power of two in [1, 1048576], got 0"),
    (["export-ciff", "src", "--out", "o.ciff", "--scale", "inf"], "finite number > 0"),
    # one meaning per flag: --queries names the queries to search; lsr encode says what it encodes with --what
    (["encode", "--dataset", "d", "--out", "o", "--queries"], "unrecognized arguments: --queries"),
    (["encode", "--dataset", "d", "--out", "o", "--what", "topics"], "argument --what: invalid choice: 'topics'"),
    (["search", "--index", "i", "--queries", "q", "--out", "o", "--backend", "triton"],
     "argument --backend: invalid choice: 'triton' (choose from 'auto', 'torch', 'gpu')"),
    (["serve", "--index", "i", "--backend", "cuda"], "argument --backend: invalid choice: 'cuda'"),
    (["rerank", "--run", "r", "--model", "m", "--dataset", "d", "--out", "o", "--backend", "torch"],
     "unrecognized arguments: --backend"),
    (["rerank", "--run", "r", "--model", "m", "--dataset", "d", "--out", "o", "--maxsim", "gpu"],
     "argument --maxsim: invalid choice: 'gpu'"),
    (["train", "c.yaml", "--device", "gpu"], "unknown device"),
])
def test_bad_option_values_exit_2(argv, text, capsys):
    assert main(argv) == 2
    assert text in capsys.readouterr().err


@pytest.mark.parametrize("argv,message", [
    (["serve", "--index", "i", "--port", "99999"], "argument --port: must be an integer in [1, 65535], got 99999"),
    (["serve", "--index", "i", "--max-wait-ms", "-1"], "argument --max-wait-ms: must be a number in [0, 60000], got -1"),
    (["index", "--vectors", "v", "--out", "o", "--block-size", "3"],
     "argument --block-size: must be a power of two in [1, 1048576], got 3"),
    (["index", "--vectors", "v", "--out", "o", "--partitions", "100000"],
     "argument --partitions: must be an integer in [1, 65536], got 100000"),
    (["index", "--vectors", "v", "--out", "o", "--workers", "0"], "argument --workers: must be an integer in [1, 1024], got 0"),
    (["encode", "--dataset", "d", "--out", "o", "--tokenize-workers", "-1"],
     "argument --tokenize-workers: must be an integer in [0, 1024], got -1"),
    (["encode", "--dataset", "d", "--out", "o", "--doc-top-k", "99999999999999999999999"],
     "argument --doc-top-k: must be >= 1 and <= 9223372036854775807, got 99999999999999999999999"),
    (["search", "--index", "i", "--queries", "q", "--out", "o", "--k", "1e3"], "argument --k: expected an integer (>= 1), got '1e3'"),
    (["search", "--index", "i", "--queries", "q", "--out", "o", "--query-scale", "-2"],
     "argument --query-scale: must be a finite number > 0, got -2"),
    (["rerank", "--run", "r", "--model", "m", "--dataset", "d", "--out", "o", "--query-batch", "0"],
     "argument --query-batch: must be >= 1, got 0"),
])
def test_out_of_range_flags_name_the_flag_value_and_range(argv, message, capsys):
    """One typed range per numeric flag (lsr.utils.ranges): argparse's usage error, exit 2, nothing loaded."""
    assert main(argv) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"lsr {argv[0]}: error: {message}"


@pytest.mark.parametrize("metric,text", [("nDCG@0", "cutoff"), ("P@0", "cutoff"), ("nDCG@1.5", "cutoff"),
                                         ("AP(foo=2)", "unknown metric")])
def test_bad_metrics_exit_2_before_trec_eval(tiny, metric, text, capsys):
    """trec_eval aborts the whole process on a cutoff of 0 (SIGABRT); the metric is refused first."""
    run = tiny["root"] / "any.trec"
    run.write_text("q0 Q0 d0 1 1.0 x\n")
    assert main(["evaluate", "--run", str(run), "--qrels", str(tiny["beir"]), "--metrics", metric]) == 2
    assert text in _err(capsys)


def test_headerless_three_column_qrels_keep_their_first_judgement(tmp_path):
    plain = tmp_path / "plain.tsv"
    plain.write_text("q1\td1\t1\nq2\td2\t2\n")
    assert read_qrels(plain) == {"q1": {"d1": 1}, "q2": {"d2": 2}}
    headed = tmp_path / "headed.tsv"
    headed.write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\n")
    assert read_qrels(headed) == {"q1": {"d1": 1}}


def test_null_ids_are_refused(tmp_path, capsys):
    with pytest.raises(ValueError, match="row 1 has no id"):
        SparseVectors([0, 1, 2], [0, 1], [1.0, 1.0], ids=["a", None])
    beir = tmp_path / "beir"
    beir.mkdir()
    (beir / "corpus.jsonl").write_text('{"_id": "d0", "text": "a b"}\n{"_id": null, "text": "c"}\n')
    (beir / "queries.jsonl").write_text('{"_id": "q0", "text": "a"}\n')
    assert main(["encode", "--dataset", str(beir), "--out", str(tmp_path / "v"), "--device", "cpu"]) == 1
    assert "corpus.jsonl:2: '_id' must be a string or an integer, got null" in _err(capsys)


def test_search_depth_is_capped_at_the_documents(tiny, capsys):
    out = tiny["root"] / "deep.trec"
    assert main(["search", "--index", str(tiny["idx"]), "--queries", str(tiny["beir"]), "--model",
                 str(tiny["vec"] / "encoder"), "--out", str(out), "--k", "1000000000", "--device", "cpu"]) == 0
    assert "(k=30)" in capsys.readouterr().out
    rows = [line.split() for line in out.read_text().splitlines()]
    assert rows and max(int(r[3]) for r in rows) <= 30


def test_overwrite_never_deletes_a_users_file(tiny, capsys):
    idx = tiny["root"] / "idx-notes"
    assert main(["index", "--vectors", str(tiny["vec"]), "--out", str(idx), "--device", "cpu"]) == 0
    (idx / "NOTES.md").write_text("mine")
    assert main(["index", "--vectors", str(tiny["vec"]), "--out", str(idx), "--device", "cpu", "--overwrite"]) == 1
    assert "'NOTES.md', which is not part of an lsr index" in _err(capsys)
    assert (idx / "NOTES.md").read_text() == "mine"
    (idx / "NOTES.md").unlink()
    assert main(["index", "--vectors", str(tiny["vec"]), "--out", str(idx), "--device", "cpu", "--overwrite"]) == 0


def test_ciff_export_guards(tiny, capsys):
    assert main(["export-ciff", str(tiny["idx"]), "--out", str(tiny["idx"] / "x.ciff")]) == 1
    assert "inside the input" in _err(capsys)
    assert main(["export-ciff", str(tiny["idx"]), "--out", str(tiny["root"] / "x.ciff"), "--scale", "1e-9"]) == 1
    assert "rounds to 0" in _err(capsys) and not (tiny["root"] / "x.ciff").exists()
    ciff, vec = tiny["root"] / "ok.ciff", tiny["root"] / "from-ciff"
    assert main(["export-ciff", str(tiny["idx"]), "--out", str(ciff)]) == 0
    assert main(["import-ciff", str(ciff), "--out", str(vec)]) == 0
    assert main(["import-ciff", str(ciff), "--out", str(vec), "--overwrite"]) == 0   # --overwrite is honoured


def test_pre_encoded_queries_are_checked_against_the_index_encoder(tiny, capsys):
    """A query vector folder carries the encoder that wrote it; a folder from another encoder is refused, as
    queries encoded on the fly are."""
    q = tiny["root"] / "qvec"
    assert main(["encode", "--dataset", str(tiny["beir"]), "--out", str(q), "--what", "queries", "--model",
                 str(tiny["vec"] / "encoder"), "--device", "cpu"]) == 0
    run = tiny["root"] / "pre.trec"
    assert main(["search", "--index", str(tiny["idx"]), "--queries", str(q), "--out", str(run), "--device", "cpu"]) == 0
    manifest = json.loads((q / "manifest.json").read_text())
    manifest["metadata"]["kind"] = "splade"
    (q / "manifest.json").write_text(json.dumps(manifest))
    capsys.readouterr()
    assert main(["search", "--index", str(tiny["idx"]), "--queries", str(q), "--out", str(run), "--overwrite",
                 "--device", "cpu"]) == 1
    assert "encoded differently (kind: queries 'splade'" in _err(capsys)


def test_text_topics_file_is_encoded_with_the_model(tiny, capsys):
    """A qid<TAB>text file with --model is encoded as text (it was read as Anserini token queries); a vector
    folder with --model is a usage error (the model would be ignored)."""
    topics = tiny["root"] / "topics.tsv"
    topics.write_text("".join(f"q{i}\t{w}\n" for i, w in enumerate(["alpha", "beta gamma"])))
    run = tiny["root"] / "topics.trec"
    model = str(tiny["vec"] / "encoder")
    assert main(["search", "--index", str(tiny["idx"]), "--queries", str(topics), "--model", model, "--out", str(run),
                 "--device", "cpu"]) == 0
    by_dataset = tiny["root"] / "dataset.trec"
    assert main(["search", "--index", str(tiny["idx"]), "--queries", str(tiny["beir"]), "--model", model, "--out",
                 str(by_dataset), "--device", "cpu"]) == 0
    q0 = [line for line in by_dataset.read_text().splitlines() if line.startswith("q0 ")]
    assert [line for line in run.read_text().splitlines() if line.startswith("q0 ")] == q0   # the same text, query
    capsys.readouterr()
    assert main(["search", "--index", str(tiny["idx"]), "--queries", str(tiny["vec"]), "--model", model, "--out",
                 str(tiny["root"] / "x.trec"), "--device", "cpu"]) == 2
    assert "already encoded" in _err(capsys)


def test_evaluate_refuses_a_run_of_other_queries(tiny, capsys):
    run = tiny["root"] / "other.trec"
    run.write_text("x1 Q0 d0 1 1.0 t\n")
    assert main(["evaluate", "--run", str(run), "--qrels", str(tiny["beir"])]) == 1
    assert "none of the 5 judged queries" in _err(capsys)


def test_search_out_that_is_a_directory(tiny, capsys):
    assert main(["search", "--index", str(tiny["idx"]), "--queries", str(tiny["beir"]), "--model",
                 str(tiny["vec"] / "encoder"), "--out", str(tiny["root"]), "--overwrite", "--device", "cpu"]) == 2
    assert "is a directory; give the path of the run file" in _err(capsys)


def test_a_folder_that_is_not_a_model(tiny, capsys):
    folder = tiny["root"] / "not-a-model"
    folder.mkdir()
    (folder / "readme.txt").write_text("hi")
    assert main(["search", "--index", str(tiny["idx"]), "--queries", str(tiny["beir"]), "--encoder", "splade",
                 "--model", str(folder), "--out", str(tiny["root"] / "nm.trec"), "--device", "cpu"]) == 1
    assert "has no config.json: not a Hugging Face checkpoint folder" in _err(capsys)


def test_bad_utf8_is_reported_at_its_line(tmp_path):
    from lsr.storage.files import iter_lines

    f = tmp_path / "t.tsv"
    f.write_bytes(b"q1\tfine\nq2\talso fine\nq3\tbad \xff byte\n" + b"q\tx\n" * 5000)
    with pytest.raises(ValueError, match=r"t.tsv:3: not UTF-8 text \(invalid start byte at byte 7 of the line\)"):
        list(iter_lines(f))


def test_api_guards_of_the_audit(tmp_path):
    """Python API: NaN in an in-memory run, negative triples merged away, a string of ids, NaN config values."""
    import numpy as np

    from lsr.config import load_config
    from lsr.data.runs import write_msmarco
    from lsr.evaluation.measures import evaluate

    qrels = {"q1": {"d1": 1}}
    with pytest.raises(ValueError, match="has score nan; scores must be finite"):
        evaluate({"q1": {"d1": float("nan"), "d5": 1.0}}, qrels, "RR@10")
    assert evaluate({"q1": {"d1": np.float32(2.0), "d5": 1.0}}, qrels, "RR@10") == {"RR@10": 1.0}
    with pytest.raises(ValueError, match="has score nan"):
        write_msmarco({"q1": {"a": float("nan"), "b": 1.0}}, tmp_path / "r.tsv")
    with pytest.raises(ValueError, match="finite and >= 0"):
        SparseVectors.from_coo([0, 0], [1, 1], [-1.0, 2.0], 1)
    with pytest.raises(TypeError, match="sequence of strings"):
        SparseVectors([0, 1, 2], [0, 1], [1.0, 1.0], ids="ab")
    from lsr.index.inverted import InvertedIndex
    from lsr.search.searcher import Searcher

    docs = SparseVectors([0, 1, 3], [0, 0, 1], [1.0, 2.0, 1.0], ids=["a", "b"])
    scores, idx = Searcher(InvertedIndex.build(docs), backend="torch").search(docs, k=np.int64(2))
    assert idx.shape == (2, 2)   # a numpy integer k is an integer
    base = "configs/scifact-bm25.yaml"
    for override, text in (("evaluation.tolerance=.nan", "finite"), ("evaluation.expected={nDCG@10: .nan}", "finite"),
                           ("device=cuda:abc", "config.device")):
        with pytest.raises(ValueError, match=text):
            load_config(base, [override])


def test_run_with_no_queries_is_an_error(tiny, tmp_path, capsys):
    import shutil

    beir = tmp_path / "beir"
    shutil.copytree(tiny["beir"], beir)
    (beir / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n")   # no judged query
    assert main(["run", "configs/scifact-bm25.yaml", "--set", f"data.dataset={beir}", "--set", f"output={tmp_path / 'o'}",
                 "--set", "device=cpu"]) == 1
    err = [line for line in capsys.readouterr().err.splitlines() if line and not line.startswith("encode")]
    assert len(err) == 1 and "no queries to search" in err[0], err


def test_searchers_name_a_malformed_device(tmp_path):
    """Searcher, ShardedSearcher, DistributedSearcher and resolve_device (create_app, LsrRetriever) answer a device
    name torch cannot parse with one line naming it and the accepted forms, before any work."""
    import torch

    from lsr.index.inverted import InvertedIndex
    from lsr.index.sharded import ShardedIndex
    from lsr.parallel.search import DistributedSearcher
    from lsr.search.factory import open_searcher
    from lsr.search.searcher import Searcher
    from lsr.search.sharded import ShardedSearcher
    from lsr.utils.devices import resolve_device

    docs = SparseVectors([0, 1, 3, 4], [0, 0, 1, 2], [1.0, 2.0, 1.0, 3.0], ids=["a", "b", "c"])
    index = InvertedIndex.build(docs)
    sharded = ShardedIndex.load(ShardedIndex.build(docs, 2, tmp_path / "idx"))
    calls = [lambda d: Searcher(index, device=d), lambda d: open_searcher(sharded, device=d),
             lambda d: ShardedSearcher(sharded, device=d), lambda d: DistributedSearcher(tmp_path / "idx", d)]
    for bad in ("gpu", "cuda:x", "CPU", "auto", -1, True):
        for call in calls:
            with pytest.raises(ValueError) as e:
                call(bad)
            message = str(e.value)
            assert repr(bad) in message and '"cuda:N"' in message and "\n" not in message, message
    for bad in ("gpu", "cuda:", "cuda 1"):
        with pytest.raises(ValueError, match=rf"unknown device '{bad}'; use auto \| cpu \| cuda \| cuda:N"):
            resolve_device(bad)
    assert Searcher(index, device="cpu").device == Searcher(index, device=torch.device("cpu")).device
    assert resolve_device("cpu") == resolve_device(torch.device("cpu")) == "cpu"
