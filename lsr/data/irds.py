"""ir_datasets as a source of ``lsr.data.dataset.Dataset``: queries, qrels and documents of an ir_datasets id, with
downloads refused before any network access when asked (offline), and every failed download turned into
a ``DatasetUnavailableError`` that names the files to place and where. ir_datasets is imported lazily.
"""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from lsr.data.dataset import LOCAL_HINT, OFFLINE_VARS, Dataset, DatasetUnavailableError, DocsIter, Qrels
from lsr.data.readers import check_new, qrels_from_rows
from lsr.utils.ids import check_id

__all__ = ["ir_docs", "load_ir_dataset"]


class _Blocked(Exception):
    pass


def _describe_download(dl: Any) -> str:
    urls = [getattr(m, "url", None) or getattr(m, "uri", None) for m in getattr(dl, "mirrors", [])]
    local = [str(m._path) for m in getattr(dl, "mirrors", []) if hasattr(m, "_path")]  # ir_datasets LocalDownload
    target = getattr(dl, "_cache_path", None)
    where = " or ".join(str(p) for p in [target, *local] if p and p != os.devnull)
    return f"{', '.join(u for u in urls if u) or '(no public URL)'} -> place it at {where or '(unknown path)'}"


@contextlib.contextmanager
def _ir_datasets_guard(spec: str, what: str, download: bool, hint: str = "") -> Iterator[None]:
    """Turn ir_datasets download failures into DatasetUnavailableError naming the files to place.

    With ``download=False`` the download is refused *before* any network access (an unreachable host
    could otherwise cost ir_datasets' 15 s timeout x retries x mirrors). This patches ir_datasets'
    ``Download`` class while the block runs (not thread-safe across concurrent loads).
    """
    from ir_datasets.util import download as irds_dl
    from ir_datasets.util import home_path

    attempted: list[str] = []
    original = irds_dl.Download.path

    def path(self: Any, force: bool = True) -> Any:
        if force and getattr(self, "_path", None) is None:
            cache = getattr(self, "_cache_path", None)
            have = (cache and os.path.exists(cache)) or any(
                hasattr(m, "_path") and Path(m._path).exists() for m in self.mirrors)
            if not have:
                attempted.append(_describe_download(self))
                if not download:
                    raise _Blocked()
        return original(self, force)

    irds_dl.Download.path = path
    try:
        yield
    except DatasetUnavailableError:
        raise
    except (_Blocked, OSError, RuntimeError) as e:
        if isinstance(e, RuntimeError) and "download" not in str(e).lower():
            raise
        reason = ("downloads are disabled (download=False or " + "/".join(OFFLINE_VARS) + " set)"
                  if isinstance(e, _Blocked) else f"the download failed: {type(e).__name__}: {str(e)[:300]}")
        files = "".join(f"\n  - {a}" for a in attempted) or f"\n  - (see the ir_datasets log above; {e!r})"
        raise DatasetUnavailableError(
            (f"{hint}.\n" if hint else "")
            + f"ir_datasets cannot provide the {what} of {spec!r}: {reason}. Missing file(s):{files}\n"
            f"ir_datasets' home is {home_path()} (IR_DATASETS_HOME, read when ir_datasets is imported); {LOCAL_HINT}."
        ) from (None if isinstance(e, _Blocked) else e)
    finally:
        irds_dl.Download.path = original


def _import_ir_datasets(spec: str, folder: str | None = None) -> Any:
    try:
        import ir_datasets
    except ImportError:
        missing = "" if folder in (None, spec) else f"{folder!r} is not an existing folder, and "
        raise DatasetUnavailableError(f"{missing}{spec!r} looks like an ir_datasets id but ir_datasets is not "
                                      f"installed (pip install ir_datasets), {LOCAL_HINT}") from None
    return ir_datasets


def ir_docs(spec: str, download: bool, hint: str = "") -> DocsIter:
    ds = _import_ir_datasets(spec).load(spec)
    with _ir_datasets_guard(spec, "documents", download, hint):
        it = iter(ds.docs_iter())
        first = next(it, None)  # opening the files (the download, if any) happens here
    if first is None:
        return
    for doc in itertools.chain([first], it):
        check_id(doc.doc_id, "doc id", spec)
        yield doc.doc_id, doc.default_text().strip()


def load_ir_dataset(spec: str, download: bool, folder: str | None = None) -> Dataset:
    """The dataset of the ir_datasets id ``spec``; ``folder``: the local folder the user may have meant instead
    (the dataset spec without the split that ``spec`` has appended), named first when ``spec`` is unknown."""
    irds = _import_ir_datasets(spec, folder)
    try:
        ds = irds.load(spec)
    except KeyError:
        known = "a known ir_datasets id (see https://ir-datasets.com)"
        if folder is None or folder == spec:
            raise ValueError(f"{spec!r} is neither an existing folder nor {known}") from None
        raise ValueError(f"{folder!r} is not an existing folder (a BEIR or TSV dataset folder), and {spec!r} is not "
                         f"{known}") from None
    queries: dict[str, str] = {}
    qrels: Qrels = {}
    if ds.has_queries():
        with _ir_datasets_guard(spec, "queries", download):
            for q in ds.queries_iter():
                check_id(q.query_id, "query id", spec)
                check_new(queries, q.query_id, "query id", spec)
                queries[q.query_id] = q.default_text().strip()
    if ds.has_qrels():
        with _ir_datasets_guard(spec, "qrels", download):
            qrels = qrels_from_rows(((0, q.query_id, q.doc_id, str(q.relevance)) for q in ds.qrels_iter()), spec)
    n_docs = None
    if ds.has_docs():
        # the count is optional: never download for it
        with contextlib.suppress(DatasetUnavailableError), _ir_datasets_guard(spec, "document count", download=False):
            n_docs = ds.docs_count()
    return Dataset(name=spec, queries=queries, qrels=qrels, n_docs=n_docs,
                   docs_source=(lambda: ir_docs(spec, download)) if ds.has_docs() else None,
                   docs_origin={"ir_datasets": irds.docs_parent_id(spec)} if ds.has_docs() else {})
