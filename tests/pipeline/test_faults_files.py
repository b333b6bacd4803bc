"""Files, provenance and concurrency faults (issue 15): stale artefacts of other documents, outputs inside
inputs or over files lsr did not write, two writers at once, a killed --overwrite swap, stale temporaries,
tampered manifests and indexes, a full disk and a denied permission, tokenizer workers and the cwd, and
the config / file errors that used to end in a traceback. Each asserts the one-line message, the exit
code and that nothing valid was lost."""

from __future__ import annotations

import errno
import gzip
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import pytest
import torch

from lsr.cli import main
from lsr.index.inverted import InvertedIndex
from lsr.sparse import SparseVectors
from lsr.storage import files as lsr_io
from lsr.storage.shards import read_manifest, read_vectors, write_vectors
from tests.conftest import DATA, REPO

DOCS = {"A": {"a1": "apple pie", "b2": "banana split", "c3": "cherry tart"},
        "B": {"x1": "pear", "y2": "apple crumble", "z3": "plum"}}
RELEVANT = {"A": "a1", "B": "y2"}


def _beir(folder, docs, relevant):
    (folder / "qrels").mkdir(parents=True)
    (folder / "corpus.jsonl").write_text("".join(json.dumps({"_id": k, "text": v}) + "\n" for k, v in docs.items()))
    (folder / "queries.jsonl").write_text(json.dumps({"_id": "q1", "text": "apple"}) + "\n")
    (folder / "qrels" / "test.tsv").write_text(f"query-id\tcorpus-id\tscore\nq1\t{relevant}\t1\n")
    return folder


@pytest.fixture
def job(tmp_path, monkeypatch):
    """Two tiny BEIR folders A and B and a BM25 config writing to out/x (cwd = tmp_path)."""
    monkeypatch.chdir(tmp_path)
    for name in DOCS:
        _beir(tmp_path / name, DOCS[name], RELEVANT[name])
    (tmp_path / "cfg.yaml").write_text("name: t\ndata:\n  dataset: A\noutput: out/x\ndevice: cpu\nsearch:\n  k: 10\n"
                                       "evaluation:\n  metrics: [RR@10]\n")
    return tmp_path


def _fails(capsys, argv, code, *needles):
    """Run the CLI in-process: exit ``code``, one stderr line, no traceback, containing ``needles``."""
    assert main(argv) == code
    err = capsys.readouterr().err.strip().splitlines()
    err = [line for line in err if not line.startswith("encode")]  # progress bars
    assert len(err) == 1 and "Traceback" not in err[0], err
    for needle in needles:
        assert needle in err[0], err[0]
    return err[0]


def _tree(folder):
    """{relative path: sha256} of every file under ``folder``."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


# ---------------------------------------------------------------------------------------- provenance
def test_run_refuses_an_output_folder_made_from_other_documents(job, capsys):
    assert main(["run", "cfg.yaml"]) == 0
    assert "RR@10\t1.0000" in capsys.readouterr().out
    before = _tree(job / "out" / "x")
    _fails(capsys, ["run", "cfg.yaml", "--set", "data.dataset=B"], 1, "out/x was made from", "B/corpus.jsonl",
           "--overwrite")
    assert _tree(job / "out" / "x") == before  # nothing replaced, config.yaml still says dataset A
    assert main(["run", "cfg.yaml", "--set", "data.dataset=B", "--overwrite"]) == 0  # recomputed: the fresh result
    assert "RR@10\t1.0000" in capsys.readouterr().out
    assert read_manifest(job / "out" / "x" / "doc_vectors")["origin"]["file"].endswith("B/corpus.jsonl")
    assert main(["run", "cfg.yaml", "--set", "data.dataset=B"]) == 0  # same documents again: artefacts reused


def test_vectors_of_other_encoder_settings_are_refused_naming_the_setting(job, capsys):
    assert main(["run", "cfg.yaml"]) == 0
    vectors = _tree(job / "out" / "x" / "doc_vectors")
    _fails(capsys, ["run", "cfg.yaml", "--set", "encoder.k1=1.2"], 1, "other settings (", "k1: 0.9 -> 1.2")
    assert _tree(job / "out" / "x" / "doc_vectors") == vectors


def test_an_edited_corpus_is_not_reused(job, capsys):
    assert main(["run", "cfg.yaml"]) == 0
    with open(job / "A" / "corpus.jsonl", "a") as f:
        f.write(json.dumps({"_id": "d4", "text": "apple"}) + "\n")
    _fails(capsys, ["run", "cfg.yaml"], 1, "A/corpus.jsonl, which has changed since", "size")


def test_encode_refuses_vectors_of_other_documents_before_refitting(job, capsys):
    assert main(["encode", "--dataset", "A", "--out", "vec"]) == 0
    before = _tree(job / "vec")
    _fails(capsys, ["encode", "--dataset", "B", "--out", "vec"], 1, "vec was made from", "B/corpus.jsonl")
    assert _tree(job / "vec") == before  # the BM25 fit of A is still the one these vectors were made with
    assert main(["encode", "--dataset", "A", "--out", "vec"]) == 0 and _tree(job / "vec") == before


def test_a_bm25_fit_of_other_documents_is_refitted(job):
    from lsr.config import load_config
    from lsr.pipeline import run_pipeline

    run_pipeline(load_config("cfg.yaml"))
    shutil.rmtree(job / "out" / "x" / "doc_vectors")
    os.remove(job / "out" / "x" / ".lsr-run.json")  # no folder-level record: the fit's own record decides
    result = run_pipeline(load_config("cfg.yaml", ["data.dataset=B"]), overwrite=True)
    assert result["metrics"] == {"RR@10": 1.0}
    fit = json.loads((job / "out" / "x" / "encoder" / "lexical.json").read_text())
    assert fit["n_docs"] == 3 and "pear" in fit["vocab"]


# ---------------------------------------------------------------------------------------- outputs vs inputs
def test_outputs_inside_inputs_are_refused(job, capsys):
    before = _tree(job / "A")
    _fails(capsys, ["run", "cfg.yaml", "--set", "output=A"], 1, "is the input A", "never writes into its inputs")
    _fails(capsys, ["run", "cfg.yaml", "--set", "output=A/sub", "--overwrite"], 1, "is inside the input A")
    _fails(capsys, ["encode", "--dataset", "A", "--out", "A/vectors"], 1, "is inside the input A")
    assert _tree(job / "A") == before
    assert main(["run", "cfg.yaml"]) == 0
    index = job / "out" / "x" / "index"
    before = _tree(index)
    _fails(capsys, ["search", "--index", str(index), "--queries", "A", "--model", "out/x/encoder",
                    "--out", str(index / "meta.json"), "--device", "cpu"], 1, "is inside the input")
    assert _tree(index) == before and InvertedIndex.load(index).n_docs == 3


def test_files_lsr_did_not_write_are_not_replaced(job, capsys):
    (job / "mine").mkdir()
    (job / "mine" / "config.yaml").write_text("my own config\n")
    _fails(capsys, ["run", "cfg.yaml", "--set", "output=mine"], 1, "was not written by lsr run", "--overwrite")
    assert (job / "mine" / "config.yaml").read_text() == "my own config\n"
    (job / "notes").mkdir()
    (job / "notes" / "todo.txt").write_text("x")
    _fails(capsys, ["encode", "--dataset", "A", "--out", "notes"], 1, "holds files lsr did not write")
    assert main(["run", "cfg.yaml"]) == 0
    (job / "run.trec").write_text("precious\n")
    argv = ["search", "--index", "out/x/index", "--queries", "A", "--model", "out/x/encoder", "--out", "run.trec",
            "--device", "cpu"]
    _fails(capsys, argv, 1, "run.trec already exists", "--overwrite")
    assert (job / "run.trec").read_text() == "precious\n"
    assert main([*argv, "--overwrite"]) == 0 and (job / "run.trec").read_text().startswith("q1 Q0 a1 1 ")
    evaluate = ["evaluate", "--run", "run.trec", "--qrels", "A", "--metrics", "RR@10", "--json"]
    _fails(capsys, [*evaluate, "cfg.yaml"], 1, "--json cfg.yaml exists and is not a metrics file lsr wrote")
    _fails(capsys, [*evaluate, "A/m.json"], 1, "is inside the input A")
    assert main([*evaluate, "m.json"]) == 0 and main([*evaluate, "m.json"]) == 0  # its own file: replaced
    assert json.loads((job / "m.json").read_text()) == {"RR@10": 1.0}
    assert (job / "cfg.yaml").read_text().startswith("name: t")


# ---------------------------------------------------------------------------------------- two writers
def _index(n_docs=5, seed=0):
    g = np.random.default_rng(seed)
    dense = (g.random((n_docs, 12)) * (g.random((n_docs, 12)) < 0.4)).astype(np.float32)
    return InvertedIndex.build(SparseVectors.from_dense(torch.from_numpy(dense), ids=[f"d{i}" for i in range(n_docs)]), device="cpu")


def test_publishing_never_replaces_what_another_writer_published(tmp_path):
    first, second = _index(seed=1), _index(seed=2)
    path = tmp_path / "idx"
    with pytest.raises(FileExistsError, match="already exists"):
        with lsr_io.atomic_directory(path) as tmp:  # the other writer publishes while this one builds
            second._write_files(tmp)
            first.save(path)
    assert InvertedIndex.load(path).docs.equal(first.docs)
    assert [p.name for p in tmp_path.iterdir()] == ["idx"]  # the loser's temporary folder is gone
    run = tmp_path / "run.trec"
    with pytest.raises(FileExistsError, match="already exists"):
        with lsr_io.atomic_write_bytes(run, replace=False) as f:
            f.write(b"second\n")
            run.write_bytes(b"first\n")
    assert run.read_bytes() == b"first\n" and sorted(p.name for p in tmp_path.iterdir()) == ["idx", "run.trec"]


@pytest.mark.slow
def test_two_lsr_index_processes_on_one_out(tmp_path):
    vec = tmp_path / "vec"
    write_vectors(vec, SparseVectors.from_dense(torch.eye(4, 6), ids=list("abcd")))
    cmd = [sys.executable, "-m", "lsr", "index", "--vectors", str(vec), "--out", str(tmp_path / "idx"),
           "--device", "cpu"]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              cwd=DATA.parent) for _ in range(2)]
    results = [(p.wait(timeout=120), p.stderr.read()) for p in procs]
    assert sorted(code for code, _ in results) == [0, 1], results
    err = next(e for code, e in results if code == 1).strip()
    assert "already exists" in err and len(err.splitlines()) == 1
    assert InvertedIndex.load(tmp_path / "idx").n_docs == 4
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("idx")] == ["idx"]


# ---------------------------------------------------------------------------------------- killed writers
def _dead_pid():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_swap_killed_between_its_renames_is_rolled_back_or_finished(tmp_path):
    old, new = _index(seed=3), _index(seed=4)
    path = tmp_path / "idx"
    old.save(path)
    pid = _dead_pid()
    # killed between the renames: the old index is aside, the new one still in its temporary folder
    os.rename(path, tmp_path / f"idx.old-{pid}-abc")
    new.save(tmp_path / f"idx.tmp-{pid}-def")
    assert InvertedIndex.load(path).docs.equal(old.docs)  # rolled back on load
    assert sorted(p.name for p in tmp_path.iterdir()) == ["idx"]
    # killed after the second rename: the new index is in place, the old one not yet deleted
    shutil.copytree(path, tmp_path / f"idx.old-{pid}-ghi")
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        shutil.copytree(path, tmp_path / f"idx.tmp-{live.pid}-jkl")  # a running writer's: kept
        new.save(path, overwrite=True)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["idx", f"idx.tmp-{live.pid}-jkl"]
    finally:
        live.kill()
        live.wait()
    assert InvertedIndex.load(path).docs.equal(new.docs)


def test_stale_temporary_files_of_dead_writers_are_removed(tmp_path):
    pid = _dead_pid()
    stale = tmp_path / f".run.trec.{pid}-x1y2.tmp"
    mine = tmp_path / f".run.trec.{os.getpid()}-x1y2.tmp"  # a live writer's (this process)
    other = tmp_path / f".other.trec.{pid}-x1y2.tmp"       # another file's
    for p in (stale, mine, other):
        p.write_text("partial")
    lsr_io.atomic_write_text(tmp_path / "run.trec", "q1 Q0 d1 1 1.0 t\n")
    assert not stale.exists() and mine.exists() and other.exists()
    assert (tmp_path / "run.trec").read_text() == "q1 Q0 d1 1 1.0 t\n"


def test_outputs_get_the_umask_permissions(tmp_path):
    mask = os.umask(0o022)
    try:
        lsr_io.atomic_write_text(tmp_path / "f.txt", "x")
        _index().save(tmp_path / "idx")
    finally:
        os.umask(mask)
    assert (tmp_path / "f.txt").stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "idx").stat().st_mode & 0o777 == 0o755


# ---------------------------------------------------------------------------------------- tampered files
def _edit_manifest(vec, change):
    m = json.loads((vec / "manifest.json").read_text())
    change(m)
    (vec / "manifest.json").write_text(json.dumps(m))


@pytest.mark.parametrize("change, message", [
    (lambda m: m.update(n_rows=m["n_rows"] - 1), "n_rows / nnz say"),
    (lambda m: m["shards"][0].update(file="../x.parquet"), "is not a file name inside the vector folder"),
    (lambda m: m["shards"][0].update(file="/etc/passwd"), "is not a file name inside the vector folder"),
    (lambda m: m.pop("shards"), "'shards' must be a list"),
    (lambda m: m["shards"][0].pop("sha256"), "needs non-negative integer"),
])
def test_manifest_entries_and_totals_are_checked(tmp_path, change, message):
    vec = tmp_path / "vec"
    write_vectors(vec, SparseVectors.from_dense(torch.eye(5, 6), ids=list("abcde")), shard_rows=2)
    _edit_manifest(vec, change)
    with pytest.raises(ValueError, match=message):
        read_vectors(vec)


def test_a_manifest_that_is_a_list_is_one_line_error(tmp_path, capsys):
    (tmp_path / "vec").mkdir()
    (tmp_path / "vec" / "manifest.json").write_text("[1]")
    _fails(capsys, ["index", "--vectors", str(tmp_path / "vec"), "--out", str(tmp_path / "idx")], 1,
           "format 'list' is not 'lsr-vectors'")


@pytest.mark.parametrize("array, value, message", [("doc_ids", 99, "posting doc ids span"),
                                                    ("doc_indices", 1000, "term ids span"),
                                                    ("doc_indptr", -1, "row pointer"),
                                                    ("doc_values", float("nan"), "doc-major weights hold NaN"),
                                                    ("doc_values", -1.0, "doc-major weights hold NaN"),
                                                    ("scores", float("nan"), "posting weights hold NaN"),
                                                    ("scores", -2.0, "posting weights hold NaN")])
def test_an_index_edited_with_its_checksums_updated_fails_on_load(tmp_path, array, value, message):
    path = tmp_path / "idx"
    _index().save(path)
    f = path / f"{array}.npy"
    a = np.load(f)
    a[1 if array == "doc_indptr" else 0] = value
    np.save(f, a)
    meta = json.loads((path / "meta.json").read_text())
    meta["files"][f.name]["sha256"] = hashlib.sha256(f.read_bytes()).hexdigest()
    (path / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=message):
        InvertedIndex.load(path)


# ---------------------------------------------------------------------------------------- format versions
def _set_json(path, key, value):
    data = json.loads(path.read_text())
    data[key] = value
    path.write_text(json.dumps(data))


@pytest.mark.parametrize("file, key, newest, how", [
    ("idx/meta.json", "version", "1 to 2", "rebuild the index with lsr index"),
    ("vec/manifest.json", "version", "1", "encode the vectors again with lsr encode"),
    ("vec/encoder/lexical.json", "format_version", "1 to 2", "refit the encoder (lsr encode)"),
])
def test_a_file_from_a_newer_lsr_or_an_unknown_format_version_is_refused(job, capsys, file, key, newest, how):
    """meta.json of version 0 or true loaded as if it were 1; each versioned file now says which lsr wrote it."""
    assert main(["encode", "--dataset", "A", "--out", "vec", "--device", "cpu"]) == 0
    assert main(["index", "--vectors", "vec", "--out", "idx", "--device", "cpu"]) == 0
    capsys.readouterr()
    search = ["search", "--index", "idx", "--queries", "A", "--model", "vec/encoder", "--out", "r.trec", "--device", "cpu"]
    if file.startswith("vec/manifest"):
        search = ["index", "--vectors", "vec", "--out", "idx2", "--device", "cpu"]
    reads = f"this lsr reads format version{'s' if ' to ' in newest else ''} {newest}"
    _set_json(job / file, key, 7)
    _fails(capsys, search, 1, f"{file} was written by a newer lsr (format version 7); {reads}: upgrade lsr or {how}")
    for bad in (0, -1, True, "2", None):
        _set_json(job / file, key, bad)
        _fails(capsys, search, 1, f"{file}: format version {bad!r} is not one lsr writes ({reads}); the file is "
                                  f"corrupt: {how}")
    assert not (job / "r.trec").exists() and not (job / "idx2").exists()


# ---------------------------------------------------------------------------------------- an output below a file
@pytest.mark.parametrize("argv", [
    "encode --dataset A --out notes.txt/vec --device cpu", "index --vectors vec --out notes.txt/a/idx --device cpu",
    "search --index idx --queries A --model vec/encoder --out notes.txt/run.trec --device cpu",
    "evaluate --run run.trec --qrels A --json notes.txt/m.json", "export-ciff idx --out notes.txt/x.ciff",
    "import-ciff x.ciff --out notes.txt/imported", "rerank --run run.trec --model m --dataset A --out notes.txt/r",
])
def test_an_output_below_an_existing_file_is_one_line_before_any_work(job, capsys, argv):
    """A bare "[Errno 17] File exists: 'notes.txt'" (or Errno 20) came after the work was done."""
    (job / "notes.txt").write_text("the user's notes")
    flag = next(a for a in argv.split() if a.startswith("--") and "notes.txt" in argv.split()[argv.split().index(a) + 1])
    value = argv.split()[argv.split().index(flag) + 1]
    _fails(capsys, argv.split(), 1, f"{flag} {value}: notes.txt is a file, not a folder; choose another {flag}")
    assert (job / "notes.txt").read_text() == "the user's notes"


def test_a_config_output_below_a_file_names_it(job, capsys):
    (job / "notes.txt").write_text("the user's notes")
    _fails(capsys, ["run", "cfg.yaml", "--set", "output=notes.txt/x"], 1,
           "notes.txt is a file, not a folder; choose another output path")
    assert (job / "notes.txt").read_text() == "the user's notes"


# ---------------------------------------------------------------------------------------- full disk, no permission
@pytest.mark.parametrize("code, message", [
    (errno.ENOSPC, "no space left on device writing out/x/run.trec: free space or choose another --out"),
    (errno.EACCES, "permission denied")])
def test_full_disk_and_denied_permission_are_one_line_and_keep_the_old_file(job, capsys, monkeypatch, code, message):
    assert main(["run", "cfg.yaml"]) == 0
    capsys.readouterr()
    run = job / "out" / "x" / "run.trec"
    before = run.read_bytes()
    real = os.fsync

    def failing_fsync(fd):
        if os.path.basename(os.readlink(f"/proc/self/fd/{fd}")).startswith(".run.trec."):
            raise OSError(code, os.strerror(code))
        return real(fd)

    monkeypatch.setattr(os, "fsync", failing_fsync)
    _fails(capsys, ["run", "cfg.yaml", "--set", "search.k=2"], 1, message)
    assert run.read_bytes() == before
    assert not [p for p in run.parent.iterdir() if p.name.endswith(".tmp")]


_UNDER_THE_FILE_LIMIT = """
import resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)   # a write past the limit then fails with EFBIG (a short write)
resource.setrlimit(resource.RLIMIT_FSIZE, (6000, 6000))
from lsr.cli import main
for argv in map(str.split, sys.argv[1:]):
    print("exit", main(argv), file=sys.stderr, flush=True)
"""


@pytest.mark.slow
def test_running_out_of_space_is_one_line_naming_the_file_and_leaves_nothing(job):
    """A real short write: the process's file size limit (RLIMIT_FSIZE) stops numpy's (index arrays), Python's
    (lexical.json, CIFF) and Arrow's (vector shards) writes as a full disk would, where numpy said "N requested
    and M written" and the others named no file. Each command exits 1 with one line and leaves no partial output."""
    rng = np.random.default_rng(0)   # random terms and counts: vectors, shards and files well past the limit
    docs = {f"d{i}": " ".join(f"w{j}" for j in rng.integers(0, 4000, 3000)) for i in range(3)}
    _beir(job / "big", docs, "d0")
    assert main(["encode", "--dataset", "big", "--out", "bigvec", "--device", "cpu"]) == 0
    assert main(["index", "--vectors", "bigvec", "--out", "bigidx", "--device", "cpu"]) == 0
    argv = ["index --vectors bigvec --out idx2 --device cpu", "export-ciff bigidx --out big.ciff",
            "encode --dataset big --out vec2 --device cpu --model bigvec/encoder",
            "encode --dataset big --out vec3 --device cpu"]
    done = subprocess.run([sys.executable, "-c", _UNDER_THE_FILE_LIMIT, *argv], cwd=job, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})
    lines = [line for line in done.stderr.splitlines() if line.startswith(("lsr ", "exit "))]
    assert lines[1::2] == ["exit 1"] * 4, done.stderr
    files = ["idx2/", "big.ciff", "vec2/part-", "vec3/encoder/lexical.json"]
    for line, command, file in zip(lines[0::2], argv, files):
        assert line.startswith(f"lsr {command.split()[0]}: error: the file size limit (ulimit -f) was reached "
                               f"writing {file}"), line
        assert line.endswith(": raise it or choose another --out"), line
    assert not (job / "idx2").exists() and not (job / "big.ciff").exists()
    assert not [p.name for p in job.rglob("*") if ".tmp" in p.name]


# ---------------------------------------------------------------------------------------- tokenizer workers
def test_tokenizer_workers_never_import_from_the_cwd(tmp_path, monkeypatch):
    pytest.importorskip("tokenizers")
    from lsr.encode.tokenize.pool import TokenizerPool, load_tokenizer, token_arrays

    tokenizer_json = (DATA / "models" / "splade-tiny" / "tokenizer.json").read_text()
    marker = tmp_path / "pwned"
    for name in ("tokenizers", "numpy"):
        (tmp_path / f"{name}.py").write_text(f"open({str(marker)!r}, 'w').write('{name}')\nraise SystemExit(3)\n")
    monkeypatch.chdir(tmp_path)
    texts = ["apple pie", "", "a longer text about banana splits"] * 3
    with TokenizerPool(tokenizer_json, max_length=16, workers=2) as pool:
        flat, lengths = pool(texts)
    want_flat, want_lengths = token_arrays(load_tokenizer(tokenizer_json, 16), texts)
    assert not marker.exists()
    np.testing.assert_array_equal(flat, want_flat)
    np.testing.assert_array_equal(lengths, want_lengths)


# ---------------------------------------------------------------------------------------- former tracebacks
def test_config_errors_are_usage_errors(job, capsys):
    (job / "bad.yaml").write_text("a: [\n")
    _fails(capsys, ["run", "bad.yaml"], 2, "bad.yaml is not valid YAML")
    _fails(capsys, ["run", "cfg.yaml", "--set", "k=["], 2, "--set k=[", "not valid YAML")
    _fails(capsys, ["run", "cfg.yaml", "--set", "encoder=5"], 2, "config.encoder must be a mapping")
    _fails(capsys, ["run", "cfg.yaml", "--set", "encoder.k1=abc"], 2, "config.encoder.k1 must be float")
    _fails(capsys, ["run", "cfg.yaml", "--set", "evaluation.metrics=5"], 2, "config.evaluation.metrics")
    _fails(capsys, ["run", "cfg.yaml", "--set", "metrics=5"], 2, "unknown key", "did you mean evaluation.metrics?")
    assert not (job / "out").exists()  # validated before any work


def test_query_file_errors_are_one_line(job, capsys):
    assert main(["run", "cfg.yaml"]) == 0
    capsys.readouterr()
    (job / "vocab.txt").write_text("[PAD]\napple\n")
    (job / "cut.tsv.gz").write_bytes(gzip.compress(b"q1\tapple apple\n")[:15])
    (job / "plain.tsv.gz").write_text("q1\tapple\n")
    (job / "q.tsv").write_text("q1\tapple\n")
    search = ["search", "--index", "out/x/index", "--out", "r.trec", "--device", "cpu", "--queries"]
    _fails(capsys, [*search, "cut.tsv.gz", "--vocab", "vocab.txt"], 1, "cut.tsv.gz: not a complete gzip file")
    _fails(capsys, [*search, "plain.tsv.gz", "--vocab", "vocab.txt"], 1, "plain.tsv.gz: not a complete gzip file")
    _fails(capsys, [*search, "q.tsv"], 1, "q.tsv is read as Anserini token queries", "--vocab", "--model")
    assert not (job / "r.trec").exists()


@pytest.mark.parametrize("line, message", [('{"text": "x"}', "got no '_id'"), ("[1, 2]", "got a JSON array")])
def test_corpus_lines_without_an_id_name_file_and_line(job, capsys, line, message):
    (job / "A" / "corpus.jsonl").write_text('{"_id": "a1", "text": "apple"}\n' + line + "\n")
    _fails(capsys, ["run", "cfg.yaml"], 1, "A/corpus.jsonl:2: expected a JSON object with '_id'", message)
    (job / "A" / "queries.jsonl").write_text(line + "\n")
    _fails(capsys, ["evaluate", "--run", "A", "--qrels", "A/qrels/test.tsv"], 1, "A is a directory; a file was expected")
    _fails(capsys, ["run", "cfg.yaml", "--set", "output=out/y"], 1, "A/queries.jsonl:1: expected a JSON object")


def test_offline_hub_id_is_one_line(job, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", tempfile.mkdtemp(dir=job))
    _fails(capsys, ["encode", "--dataset", "A", "--out", "v", "--encoder", "splade", "--model",
                    "naver/no-such-model-xyz", "--device", "cpu"], 1, "downloads are off (HF_HUB_OFFLINE=1)")


def test_a_sharded_index_from_a_newer_lsr_is_refused(job, capsys):
    """The sharded manifest said 'not supported' without what to do, and loaded version 0 or true."""
    assert main(["encode", "--dataset", "A", "--out", "vec", "--device", "cpu"]) == 0
    assert main(["index", "--vectors", "vec", "--out", "idx", "--partitions", "2", "--device", "cpu"]) == 0
    capsys.readouterr()
    search = ["search", "--index", "idx", "--queries", "A", "--model", "vec/encoder", "--out", "r.trec", "--device", "cpu"]
    _set_json(job / "idx/manifest.json", "version", 7)
    _fails(capsys, search, 1, "idx/manifest.json was written by a newer lsr (format version 7)")
    _set_json(job / "idx/manifest.json", "version", True)
    _fails(capsys, search, 1, "idx/manifest.json: format version True is not one lsr writes")
    assert not (job / "r.trec").exists()
