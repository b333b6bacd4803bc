"""Datasets: documents, queries and relevance judgements from one spec string.

``load_dataset(spec, split=None)`` accepts

1. **A local BEIR folder** (``corpus.jsonl`` with ``_id``/``title``/``text``, ``queries.jsonl`` with
   ``_id``/``text``, ``qrels/<split>.tsv`` with a ``query-id corpus-id score`` header; any file may be
   ``.gz``). ``split`` defaults to ``"test"``; ``"folder:split"`` also selects it. As in BEIR, the
   queries are those named in the split's qrels; a folder without ``qrels/`` gives all queries and no
   qrels. Document text is ``title + " " + text`` (Pyserini's "flat" BEIR indexes).
2. **A local TSV folder** (the MS MARCO layout): ``collection.tsv`` (``docno<TAB>text``),
   ``queries.tsv`` (``qid<TAB>text``) and optional TREC qrels ``qrels.tsv`` or ``qrels.txt``
   (``qid 0 docno grade``). A first row of column names (``id<TAB>text``, ``docid<TAB>text``,
   ``pid<TAB>passage``, ``qid<TAB>query``...: a known id column name and a one-word text column) is a header,
   skipped (logged at info level, ``-v``), not read as a document or query. With a split ``s`` the files are ``queries.s.tsv`` and ``qrels.s.tsv`` /
   ``qrels.s.txt`` (e.g. MS MARCO's ``queries.dev.small.tsv`` + ``qrels.dev.small.tsv``).
3. **A Hugging Face dataset** ``hf:ORG/NAME[?options]`` or a local Parquet / JSONL file with a column
   mapping (``docs.parquet?text=body&queries=q.jsonl&qrels=test.tsv``): see :mod:`lsr.data.hf`.
4. **An ir_datasets id** (``msmarco-passage/dev/small``, ``beir/scifact/test``; ``split`` is appended
   as ``/<split>``). Topics and qrels of the ids in :data:`BUILTIN` are read from the data folder
   shipped with lsr (``$LSR_DATA``, else the repository's ``data/``) when it is there, so they work
   offline; anything else goes through ir_datasets (imported lazily). Downloads are refused when
   ``LSR_OFFLINE``, ``HF_HUB_OFFLINE`` or ``HF_DATASETS_OFFLINE`` is set (or ``download=False``);
   a missing file raises :class:`DatasetUnavailableError` naming the files to place and where.

Text fields are stripped of surrounding whitespace; files may start with a UTF-8 BOM and use CRLF line
ends. Duplicate doc ids, query ids or (query, doc) judgements raise ``ValueError`` naming the id, and
so do ids that a run file cannot hold (empty, whitespace, control or invisible characters: see
:func:`lsr.utils.ids.check_id`): queries and qrels when the dataset is loaded, documents as they are read.
"""


from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from lsr.data.dataset import LOCAL_HINT, OFFLINE_VARS, Dataset, DatasetUnavailableError, DocsIter, Qrels, offline
from lsr.data.readers import (
    DOC_HEADER_IDS,
    check_new,
    iter_tsv_rows,
    qrels_from_rows,
    read_beir_qrels,
    read_beir_queries,
    read_jsonl,
    read_qrels,
    read_topics_tsv,
    read_trec_qrels,
    text_field,
    tsv_has_header,
    unique_docs,
)
from lsr.storage.files import count_lines
from lsr.storage.provenance import file_origin
from lsr.utils.ids import check_id

# the dataset record and the file readers are defined in lsr.data.dataset / lsr.data.readers (which the
# other sources import too) and named here as well: this module is where users look for them
__all__ = [
    "BUILTIN",
    "LOCAL_HINT",
    "OFFLINE_VARS",
    "check_new",
    "Dataset",
    "DatasetUnavailableError",
    "data_root",
    "load_dataset",
    "read_beir_qrels",
    "read_beir_queries",
    "read_qrels",
    "read_topics_tsv",
    "read_trec_qrels",
    "qrels_from_rows",
    "unique_docs",
]

_MSMARCO_PASSAGE_DOCS = 8_841_823  # ir_datasets / MS MARCO v1 passage collection size


# ---------------------------------------------------------------------------------------- local folders
def _find(folder: Path, name: str) -> Path | None:
    for candidate in (folder / name, folder / f"{name}.gz"):
        if candidate.is_file():
            return candidate
    return None




def _beir_corpus(path: Path) -> DocsIter:
    for where, obj in read_jsonl(path):
        doc_id = str(obj["_id"])
        check_id(doc_id, "doc id", where)
        title = text_field(obj.get("title"), "'title'", where, required=False)
        yield doc_id, f"{title} {text_field(obj.get('text'), repr('text'), where, required=True)}".strip()


_COLLECTION_LAYOUT = "docno<TAB>text"


def _tsv_collection(path: Path) -> DocsIter:
    for n, docno, text in iter_tsv_rows(path, _COLLECTION_LAYOUT, DOC_HEADER_IDS):
        check_id(docno, "doc id", f"{path}:{n}")
        yield docno, text


def _tsv_count(path: Path) -> int:
    """The documents of a TSV collection: its lines, less a header row."""
    return count_lines(path) - tsv_has_header(path, _COLLECTION_LAYOUT, DOC_HEADER_IDS)


def _local_docs(path: Path, reader: Callable[[Path], DocsIter]) -> Callable[[], DocsIter]:
    return lambda: unique_docs(reader(path), path)


def _load_beir(folder: Path, split: str | None, explicit: bool) -> Dataset:
    split = split or "test"
    corpus, queries_file = _find(folder, "corpus.jsonl"), _find(folder, "queries.jsonl")
    if queries_file is None:
        raise FileNotFoundError(f"BEIR folder {folder} has no queries.jsonl")
    queries = read_beir_queries(queries_file)
    qrels: Qrels = {}
    qrels_dir = folder / "qrels"
    if qrels_dir.is_dir():
        qrels_file = _find(qrels_dir, f"{split}.tsv")
        if qrels_file is None:
            splits = sorted(p.name.split(".")[0] for p in qrels_dir.glob("*.tsv*"))
            raise FileNotFoundError(f"{qrels_dir} has no {split}.tsv; available splits: {splits}")
        qrels = read_beir_qrels(qrels_file)
        missing = [q for q in qrels if q not in queries]
        if missing:
            raise ValueError(f"{qrels_file} judges query {missing[0]!r}, which is not in {queries_file}")
        queries = {q: queries[q] for q in qrels}  # BEIR: a split's queries are those it judges
    elif explicit:
        raise FileNotFoundError(f"BEIR folder {folder} has no qrels/ folder for split {split!r}")
    return Dataset(name=f"{folder}:{split}", queries=queries, qrels=qrels,
                   n_docs=count_lines(corpus) if corpus else None,
                   docs_source=_local_docs(corpus, _beir_corpus) if corpus else None,
                   docs_origin=file_origin(corpus) if corpus else {})


def _load_tsv(folder: Path, split: str | None) -> Dataset:
    stem = f".{split}" if split else ""
    queries_file = _find(folder, f"queries{stem}.tsv")
    if queries_file is None:
        raise FileNotFoundError(f"TSV folder {folder} has no queries{stem}.tsv")
    qrels_file = _find(folder, f"qrels{stem}.tsv") or _find(folder, f"qrels{stem}.txt")
    collection = _find(folder, "collection.tsv")
    return Dataset(name=f"{folder}:{split}" if split else str(folder), queries=read_topics_tsv(queries_file),
                   qrels=read_trec_qrels(qrels_file) if qrels_file else {},
                   n_docs=_tsv_count(collection) if collection else None,
                   docs_source=_local_docs(collection, _tsv_collection) if collection else None,
                   docs_origin=file_origin(collection) if collection else {})


def _load_folder(folder: Path, split: str | None, explicit: bool) -> Dataset:
    if _find(folder, "corpus.jsonl") or _find(folder, "queries.jsonl"):
        return _load_beir(folder, split, explicit)
    if _find(folder, "collection.tsv") or list(folder.glob("queries*.tsv*")):
        return _load_tsv(folder, split)
    raise FileNotFoundError(f"{folder} is neither a BEIR folder (corpus.jsonl, queries.jsonl, qrels/) nor a TSV "
                            "folder (collection.tsv, queries.tsv, qrels.tsv)")


# ---------------------------------------------------------------------------------------- shipped data
@dataclass(frozen=True)
class _Builtin:
    folder: str
    topics: str | None = None  # TSV topics + TREC qrels (msmarco-passage) ...
    qrels: str | None = None
    judged_only: bool = False
    beir_split: str | None = None  # ... or a BEIR folder split


BUILTIN: dict[str, _Builtin] = {
    "msmarco-passage/dev/small": _Builtin("msmarco-passage", "topics.msmarco-passage.dev-subset.txt",
                                          "qrels.msmarco-passage.dev-subset.txt"),
    "msmarco-passage/trec-dl-2019/judged": _Builtin("msmarco-passage", "topics.dl19-passage.txt",
                                                    "qrels.dl19-passage.txt", judged_only=True),
    "msmarco-passage/trec-dl-2020": _Builtin("msmarco-passage", "topics.dl20.txt", "qrels.dl20-passage.txt"),
    "msmarco-passage/trec-dl-2020/judged": _Builtin("msmarco-passage", "topics.dl20.txt", "qrels.dl20-passage.txt",
                                                    judged_only=True),
    "beir/scifact/test": _Builtin("scifact", beir_split="test"),
    "beir/scifact/train": _Builtin("scifact", beir_split="train"),
}


def data_root() -> Path | None:
    """The shipped data folder: ``$LSR_DATA`` if set, else the repository's ``data/`` if present."""
    env = os.environ.get("LSR_DATA")
    if env:
        return Path(env).expanduser()
    repo_data = Path(__file__).resolve().parents[2] / "data"
    return repo_data if repo_data.is_dir() else None


def _load_builtin(spec: str, entry: _Builtin, root: Path, download: bool) -> Dataset | None:
    folder = root / entry.folder
    if entry.beir_split:
        if not (_find(folder, "queries.jsonl") and (folder / "qrels").is_dir()):
            return None
        ds = _load_beir(folder, entry.beir_split, explicit=True)
        ds.name = spec
        return ds
    topics, qrels_file = folder / entry.topics, folder / entry.qrels
    if not (topics.is_file() and qrels_file.is_file()):
        return None
    queries, qrels = read_topics_tsv(topics), read_trec_qrels(qrels_file)
    if entry.judged_only:
        queries = {q: t for q, t in queries.items() if q in qrels}
    collection = _find(folder, "collection.tsv")
    return Dataset(name=spec, queries=queries, qrels=qrels, n_docs=_MSMARCO_PASSAGE_DOCS,
                   docs_source=lambda: _msmarco_docs(folder, download),
                   docs_origin=file_origin(collection) if collection else {"ir_datasets": "msmarco-passage"})


def _msmarco_docs(folder: Path, download: bool) -> DocsIter:
    collection = _find(folder, "collection.tsv")
    if collection is not None:
        return unique_docs(_tsv_collection(collection), collection)
    hint = (f"docs for msmarco-passage need ir_datasets' collection or a local collection.tsv "
            f"(docno<TAB>text, e.g. from MS MARCO's collectionandqueries.tar.gz) at {folder / 'collection.tsv'}")
    from lsr.data.irds import ir_docs

    return ir_docs("msmarco-passage", download, hint)


# ---------------------------------------------------------------------------------------- entry point
SPEC_FORMS = ("a BEIR or TSV folder (optionally folder:split), hf:ORG/NAME, a .parquet / .jsonl file, or an "
              "ir_datasets id such as msmarco-passage/dev/small")


def _check_id_shape(spec: str) -> None:
    """Refuse, before ir_datasets is asked, a spec that cannot be an ir_datasets id: empty, a bare ``name:``
    (YAML reads ``hf:`` alone as a mapping, a shell eats what follows) or a scheme lsr does not have."""
    head, colon, tail = spec.partition(":")
    if not spec.strip():
        raise ValueError(f"the dataset spec is empty; give {SPEC_FORMS}")
    if colon and not tail.strip():
        raise ValueError(f"dataset spec {spec!r} has nothing after {head + ':'!r}; give {SPEC_FORMS}")
    if colon and head.lower() in ("irds", "ir_datasets", "ir-datasets"):
        raise ValueError(f"dataset spec {spec!r}: ir_datasets ids take no prefix: use {tail!r}")


def load_dataset(spec: str | os.PathLike, split: str | None = None, *, download: bool | None = None) -> Dataset:
    """Load a dataset from a local folder (``"dir"`` or ``"dir:split"``) or an ir_datasets id.

    See the module docstring for the folder layouts. ``download=None`` lets ir_datasets download
    unless an offline variable (``LSR_OFFLINE``, ``HF_HUB_OFFLINE``, ``HF_DATASETS_OFFLINE``) is set.
    """
    spec = os.fspath(spec)
    path = Path(spec).expanduser()
    if path.is_dir():
        return _load_folder(path, split, explicit=split is not None)
    head, colon, tail = spec.rpartition(":")
    folder_split = bool(colon and head and tail and "/" not in tail)   # "folder:split"
    if folder_split and Path(head).expanduser().is_dir():
        if split is not None and split != tail:
            raise ValueError(f"split given twice: {tail!r} in {spec!r} and split={split!r}")
        return _load_folder(Path(head).expanduser(), tail, explicit=True)
    from lsr.data import hf as hf_datasets  # hf: ids and Parquet / JSONL files (imports `datasets` only when used)

    if hf_datasets.handles(spec):
        return hf_datasets.load_spec(spec, split, download=(not offline()) if download is None else download)
    folder = head if folder_split else spec   # what a user meant as a folder: named without the split
    if Path(folder).expanduser().exists() or folder.startswith(("/", "./", "../", "~")):
        what = "" if Path(folder).expanduser().exists() else " (it does not exist)"
        raise FileNotFoundError(f"{folder!r} is not a dataset folder{what}: give a folder with the BEIR layout (corpus.jsonl, queries.jsonl, "
                                "qrels/) or the TSV one (collection.tsv, queries.tsv, qrels.tsv)")
    _check_id_shape(spec)
    ds_id = f"{spec.rstrip('/')}/{split}" if split else spec
    allow = (not offline()) if download is None else download
    entry, root = BUILTIN.get(ds_id), data_root()
    if entry is not None and root is not None:
        ds = _load_builtin(ds_id, entry, root, allow)
        if ds is not None:
            return ds
    from lsr.data.irds import load_ir_dataset

    return load_ir_dataset(ds_id, allow, folder)
