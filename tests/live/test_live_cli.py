"""``lsr index --live`` / ``--add`` / ``--upsert`` / ``--delete`` / ``--compact`` and ``lsr search`` on a live
index, through ``lsr.cli.main``: the live folder's run file is, line for line, the run of an index built with
``lsr index`` from a vector folder holding exactly its live documents in order; the refusals are one line with
the right exit code."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from lsr.cli import main
from lsr.live import LiveIndex
from lsr.storage.shards import write_vectors
from tests.conftest import REPO
from tests.live.test_live import docs_of, queries


def lsr(*argv: str | Path) -> int:
    return main([str(a) for a in argv])


def last_line(capsys) -> tuple[str, str]:
    """(the last line printed, the whole of stderr) since the previous call."""
    out, err = capsys.readouterr()
    return (out.strip().splitlines() or [""])[-1], err


@pytest.fixture
def folders(tmp_path, capsys):
    """A live index of d0..d29 at tmp/live, the query vectors at tmp/q, and vector folders for updates."""
    write_vectors(tmp_path / "base", docs_of([f"d{i}" for i in range(30)], 0))
    write_vectors(tmp_path / "more", docs_of([f"d{i}" for i in range(30, 36)], 1))
    write_vectors(tmp_path / "changed", docs_of(["d3", "d31", "d7", "d40"], 2))
    write_vectors(tmp_path / "q", queries())
    assert lsr("index", "--vectors", tmp_path / "base", "--out", tmp_path / "live", "--live", "--device", "cpu",
               "--block-size", "16") == 0
    return tmp_path


def search_lines(tmp_path: Path, index: Path, name: str, *extra: str | Path) -> list[str]:
    out = tmp_path / f"{name}.trec"
    assert lsr("search", "--index", index, "--queries", tmp_path / "q", "--out", out, "--k", "12",
               "--device", "cpu", *extra) == 0
    return out.read_text().splitlines()


def rebuilt_lines(tmp_path: Path, name: str, *extra: str | Path) -> list[str]:
    """The run of ``lsr index`` over a vector folder of the live documents, in order."""
    write_vectors(tmp_path / f"{name}-docs", LiveIndex.open(tmp_path / "live", write=False).documents())
    assert lsr("index", "--vectors", tmp_path / f"{name}-docs", "--out", tmp_path / f"{name}-index",
               "--device", "cpu", "--block-size", "16") == 0
    return search_lines(tmp_path, tmp_path / f"{name}-index", f"{name}-rebuilt", *extra)


def test_updates_then_search_equal_a_rebuild(folders, capsys):
    t, live = folders, folders / "live"
    assert last_line(capsys)[0].startswith(f"made live index {live}: 30 documents, ")
    assert lsr("index", "--out", live, "--add", t / "more") == 0
    assert last_line(capsys)[0] == f"added 6 documents to {live} (update 1; 36 live documents)"
    assert lsr("index", "--out", live, "--upsert", t / "changed") == 0
    assert last_line(capsys)[0] == f"upserted 4 documents (3 replaced, 1 new) in {live} (update 2; 37 live documents)"
    (t / "gone.txt").write_text("\ufeffd5\n\n  d30 \nd99\n", encoding="utf-8")
    assert lsr("index", "--out", live, "--delete", t / "gone.txt", "--delete-missing", "ignore") == 0
    assert last_line(capsys)[0] == (f"deleted 2 documents from {live} (update 3; 35 live documents; 1 listed not "
                                    "in it, ignored)")
    ids = LiveIndex.open(live, write=False).documents().ids
    assert ids[:3] == ["d0", "d1", "d2"] and "d5" not in ids and ids[-4:] == ["d3", "d31", "d7", "d40"]

    (t / "deny.txt").write_text("d1\nd31\n")
    (t / "allow.txt").write_text("\n".join(ids[::3]) + "\n")
    for name, extra in (("plain", ()), ("deny", ("--deny-docnos", t / "deny.txt")),
                        ("allow", ("--allow-docnos", t / "allow.txt"))):
        got = search_lines(t, live, f"live-{name}", *extra)
        assert got and got == rebuilt_lines(t, name, *extra), name

    (t / "more2").mkdir()
    write_vectors(t / "more2" / "v", docs_of(["d50", "d51"], 3))
    capsys.readouterr()
    assert lsr("index", "--out", live, "--add", t / "more2" / "v", "--compact") == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out == [f"added 2 documents to {live} (update 4; 37 live documents)",
                   f"compacted {live} into generation 1 (37 documents; update 4 is the last it holds)"]
    assert sorted(p.name for p in live.iterdir() if p.name.startswith(("base-", "wal-"))) == ["base-000001",
                                                                                             "wal-000001.log"]
    assert search_lines(t, live, "compacted") == rebuilt_lines(t, "compacted")
    assert lsr("index", "--out", live, "--compact") == 0
    assert last_line(capsys)[0].startswith(f"compacted {live} into generation 2 (37 documents")


def test_explain_on_a_live_index_names_its_parts(folders, capsys):
    t = folders
    assert lsr("index", "--out", t / "live", "--add", t / "more") == 0
    (t / "gone.txt").write_text("d2\n")
    assert lsr("index", "--out", t / "live", "--delete", t / "gone.txt") == 0
    capsys.readouterr()
    assert lsr("search", "--index", t / "live", "--queries", t / "q", "--explain", "--device", "cpu") == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == (f"live index {t / 'live'}: 29 base + 6 added documents (generation 0, update 2); the plan "
                      "below is the base index's")
    assert any("filter" in line and "29 of 30 documents allowed" in line for line in out)   # the deleted one


def one_error(capsys, code: int, rc: int, *needles: str) -> None:
    out, err = capsys.readouterr()
    assert rc == code, err
    assert len(err.strip().splitlines()) == 1, err
    for needle in needles:
        assert needle in err, (needle, err)


def test_refusals_are_one_line(folders, capsys):
    t, live = folders, folders / "live"
    capsys.readouterr()
    one_error(capsys, 2, lsr("index", "--vectors", t / "base", "--out", t / "x", "--live", "--partitions", "2"),
              "--live", "--partitions")
    (t / "meta.jsonl").write_text('{"_id": "d0", "year": 1}\n')
    one_error(capsys, 2, lsr("index", "--vectors", t / "base", "--out", t / "x", "--live", "--metadata",
                             t / "meta.jsonl"), "--live", "--metadata")
    one_error(capsys, 1, lsr("index", "--vectors", t / "base", "--out", live, "--live", "--device", "cpu"),
              f"--out {live} already exists")
    assert lsr("index", "--vectors", t / "base", "--out", t / "plain", "--device", "cpu") == 0
    capsys.readouterr()
    for flag in (("--add", t / "more"), ("--upsert", t / "more"), ("--delete", t / "base"), ("--compact",)):
        one_error(capsys, 2, lsr("index", "--out", t / "plain", *flag), f"--out {t / 'plain'} is not a live index",
                  "--live", flag[0])
    one_error(capsys, 2, lsr("index", "--out", live, "--add", t / "more", "--delete", t / "x"), "--add and --delete: one update")
    one_error(capsys, 2, lsr("index", "--out", live, "--delete-missing", "ignore", "--compact"), "--delete FILE")
    one_error(capsys, 1, lsr("index", "--out", live, "--add", t / "changed"),
              "2 docno(s) are in the index already ('d3', 'd7')", "use --upsert")
    (t / "gone.txt").write_text("d1\nnope\n")
    one_error(capsys, 1, lsr("index", "--out", live, "--delete", t / "gone.txt"),
              "not in the index ('nope')", "--delete-missing ignore")
    assert LiveIndex.open(live, write=False).seq == 0   # nothing refused was written
    one_error(capsys, 2, lsr("search", "--index", live, "--queries", t / "q", "--out", t / "r.trec",
                             "--filter", "year > 1"), "--filter", "live index", "--deny-docnos")
    # a deleted document is not in the live index: a docno list naming it is refused, as by a rebuilt index
    (t / "d1.txt").write_text("d1\n")
    assert lsr("index", "--out", live, "--delete", t / "d1.txt") == 0
    capsys.readouterr()
    one_error(capsys, 1, lsr("search", "--index", live, "--queries", t / "q", "--out", t / "r.trec", "--device",
                             "cpu", "--deny-docnos", t / "d1.txt"), "not in the index ('d1')")
    assert not (t / "r.trec").exists()


def test_a_second_writer_is_refused_and_readers_are_not(folders, capsys):
    t, live = folders, folders / "live"
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from lsr.live import LiveIndex; live = LiveIndex.open(sys.argv[1]); "
        "print('open', flush=True); time.sleep(60)"), str(live)],
        env=dict(os.environ, PYTHONPATH=str(REPO)), stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "open"
        capsys.readouterr()
        one_error(capsys, 1, lsr("index", "--out", live, "--add", t / "more", "--device", "cpu"),
                  f"{live} is being written by another job (pid {holder.pid} on host ")
        assert search_lines(t, live, "while-held")   # readers never take the writer lock
    finally:
        holder.kill()
        holder.wait()
    assert lsr("index", "--out", live, "--add", t / "more", "--device", "cpu") == 0
