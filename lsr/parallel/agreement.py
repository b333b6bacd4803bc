"""The one agreement at the start of every distributed job: the ranks compare what each will use, in one collective.

Every job that runs on several ranks (``lsr run``, ``lsr encode``, ``lsr index --partitions``, ``lsr search``,
``lsr train`` under torchrun, ``DistributedSearcher``) opens with ``agreement``: each rank describes what it
is about to read and where it will write as a few ``Part`` s (a cheap fingerprint of each), and one
``all_gather_object`` brings every rank's parts to every rank. Any difference from rank 0's ends every rank,
before any work, with the same one-line ``RanksDisagree`` naming the rank, the file and what differs. A rank
that cannot even describe its inputs (a missing file) raises its own error and the others say which rank
failed and why, in the same collective.

What a fingerprint reads (cheap: a few MiB at most per file, never a whole index or corpus):

* an index (``index_parts``): its layout (a plain index or a sharded one of P
  partitions), document and vocabulary counts and the sha256 of each file that meta.json / the sharded manifest records, so a copy of
  the same shape with other weights differs; loading then checks the files against those checksums;
* a file or folder given as an input (``content_part``): each file's size and the sha256 of its bytes (of a
  sample of 16 x 64 KiB spread over files larger than 1 MiB: retrained or other weights of one shape differ
  there), or the manifest of an lsr folder (which records its shards' checksums);
* the documents (``corpus_part``): the count, and the corpus file's size and sampled hash (or, with no
  local file, the origin and a hash of the first documents), so a truncated or older copy differs;
* settings (``config_parts``, ``settings_part``): every value of the config or command line, input paths
  compared by content (their path may differ from host to host) and the output folder by its path (all
  ranks must write into one shared folder).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Part", "RanksDisagree", "agreement", "config_parts", "content_part", "corpus_part", "file_digest",
           "first_difference", "index_parts", "output_part", "settings_part"]

WHOLE_FILE_BYTES = 1 << 20    # files up to this size are hashed whole
SAMPLE_CHUNKS, CHUNK_BYTES = 16, 64 << 10   # larger ones: this many chunks spread over the file (1 MiB read)
MAX_FILES = 64                # files of a folder hashed (64 MiB read at most); past them only sizes compared
SAMPLE_DOCS = 64              # documents hashed when the corpus has no local file
SAME_FIX = "start every rank with the same command and config and the same copies of its inputs"


class RanksDisagree(RuntimeError):
    """The ranks of a job were given different inputs or settings (the same one-line message on every rank)."""


@dataclass(frozen=True)
class Part:
    """One thing a rank uses: ``what`` it is ("index", "documents", "config encoder.model", ...), the ``path``
    this rank reads or writes (named in the message; None for settings), ``fields`` compared in order (a name
    -> a short text) and the ``fix`` printed when they differ."""

    what: str
    path: str | None
    fields: dict[str, str] = field(default_factory=dict)
    fix: str = SAME_FIX


# ----------------------------------------------------------------------------------- fingerprints
def file_digest(path: Path) -> str:
    """"N bytes, sha256 H" of the file (of a sample of its bytes past ``WHOLE_FILE_BYTES``)."""
    size = path.stat().st_size
    h = hashlib.sha256()
    with open(path, "rb") as f:
        if size <= WHOLE_FILE_BYTES:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
            return f"{size} bytes, sha256 {h.hexdigest()[:16]}"
        for i in range(SAMPLE_CHUNKS):   # the first and last chunks included
            f.seek((size - CHUNK_BYTES) * i // (SAMPLE_CHUNKS - 1))
            h.update(f.read(CHUNK_BYTES))
    return f"{size} bytes, sha256 of a sample {h.hexdigest()[:16]}"


def _folder_files(folder: Path) -> list[Path]:
    """The files under ``folder`` in name order, hidden files and folders (working folders, caches) left out."""
    out = []
    for root, dirs, files in os.walk(folder, followlinks=True):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        out += [Path(root) / f for f in sorted(files) if not f.startswith(".")]
    return sorted(out)


def content_part(what: str, path: str | os.PathLike, fix: str = "") -> Part:
    """The content of a file or folder: every file's size and sha256 (of a sample past 1 MiB); in a folder with
    an lsr manifest (manifest.json / meta.json records the other files' checksums) that manifest's hash and the
    other files' sizes."""
    p = Path(path)
    fix = fix or f"give every rank the same {what} (copy rank 0's to the others)"
    if p.is_file():
        return Part(what, str(p), {"": file_digest(p)}, fix)
    files = _folder_files(p)
    recorded = {"manifest.json", "meta.json"} & {f.name for f in files if f.parent == p}
    fields = {}
    for n, f in enumerate(files):
        rel = str(f.relative_to(p))
        if (recorded and rel not in recorded) or n >= MAX_FILES:
            fields[rel] = f"{f.stat().st_size} bytes"
        else:
            fields[rel] = file_digest(f)
    return Part(what, str(p), fields or {"": "an empty folder"}, fix)


def index_parts(path: str | os.PathLike) -> list[Part]:
    """An index folder, plain or sharded: its layout and counts, then the checksums its meta.json or sharded
    manifest records (so another build of the same shape differs), then those files' own hashes."""
    from lsr.index.inverted import InvertedIndex
    from lsr.index.sharded import is_sharded, read_sharded_manifest

    p = Path(path)
    fix = "give every rank the same index (copy rank 0's to the others, or build each copy from the same vectors)"
    if is_sharded(p):
        m = read_sharded_manifest(p)
        fields = {"layout": f"a sharded index of {len(m['partitions'])} partitions", "documents": str(m["n_docs"]),
                  "vocabulary": str(m["vocab_size"]),
                  "max_scores.npy": f"sha256 {str((m.get('max_scores') or {}).get('sha256'))[:16]}"}
        fields |= {f"{e['dir']}/meta.json": f"sha256 {str(e.get('meta_sha256'))[:16]}" for e in m["partitions"]}
        names = ["manifest.json"]
    else:
        m = InvertedIndex.read_meta(p)
        fields = {"layout": "a plain index", "documents": str(m.get("n_docs")),
                  "vocabulary": str(m.get("vocab_size"))}
        fields |= {name: f"sha256 {str((entry or {}).get('sha256'))[:16]}"
                   for name, entry in sorted((m.get("files") or {}).items())}
        names = ["meta.json"]
    fields |= {name: file_digest(p / name) for name in names}
    return [Part("index", str(p), fields, fix)]


def corpus_part(dataset: Any) -> Part:
    """The documents of a dataset (``lsr.data.Dataset``): their count and the corpus file's size and hash of a
    sample; with no local file, the origin and a hash of the first documents."""
    origin = dict(getattr(dataset, "docs_origin", None) or {})
    fields = {"documents": str(dataset.n_docs) if dataset.n_docs is not None else "not counted"}
    source = origin.get("file")
    if source and Path(source).is_file():
        fields["file"] = file_digest(Path(source))
    else:
        fields |= {k: str(v) for k, v in sorted(origin.items()) if k not in ("file", "size", "mtime_ns")}
        h = hashlib.sha256()
        for doc_id, text in itertools.islice(dataset.docs_iter(), SAMPLE_DOCS):
            h.update(json.dumps([doc_id, text]).encode())
        fields[f"the first {SAMPLE_DOCS} documents"] = f"sha256 {h.hexdigest()[:16]}"
    return Part("documents", str(source or dataset.name), fields,
                "give every rank the same documents (a local copy that is complete and current on every host)")


def output_part(path: str | os.PathLike, what: str = "output folder") -> Part:
    """Where the job writes: every rank must name one folder (on several hosts, one they all share)."""
    resolved = str(Path(path).resolve())
    return Part(what, resolved, {"": resolved},
                f"give every rank the same {what} (on several hosts, a folder they all share)")


def settings_part(what: str, values: Mapping[str, Any]) -> Part:
    """Plain values (a config's, a command's options) compared as their JSON text, key by key."""
    return Part(what, None, {k: json.dumps(v, sort_keys=True, default=str) for k, v in values.items()})


def _flatten(values: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in values.items():
        if isinstance(v, Mapping) and v:
            out |= _flatten(v, f"{prefix}{k}.")
        else:
            out[f"{prefix}{k}"] = v
    return out


def _local_path(value: Any) -> Path | None:
    """The existing file or folder a config string names (a dataset may read "FOLDER:SPLIT"), else None."""
    if not isinstance(value, str) or not value:
        return None
    for candidate in (value, value.rsplit(":", 1)[0]):
        if Path(candidate).exists():
            return Path(candidate)
    return None


def config_parts(config: Mapping[str, Any], output_key: str | None = "output", covered: tuple[str, ...] = ()
                 ) -> list[Part]:
    """A config (``to_dict()``) as parts: the output folder by its path, each value naming an existing file or
    folder by its content (its path may differ between hosts), the other values by value; the dotted keys in
    ``covered`` are left out (the caller compares them by content in a part of its own)."""
    flat = _flatten(config)
    parts, values = [], {}
    for key, value in flat.items():
        if key in covered:
            continue
        local = _local_path(value) if key != output_key else None
        if key == output_key and value:
            parts.append(output_part(value))
        elif local is not None:
            parts.append(content_part(f"config {key}", local))
        else:
            values[key] = value
    return [settings_part("config", values), *parts]


# ----------------------------------------------------------------------------------- comparison
def first_difference(ours: Part, theirs: Part) -> tuple[str, str, str] | None:
    """(field, rank 0's text, the other rank's) of the first field that differs, or None."""
    for key in dict.fromkeys([*ours.fields, *theirs.fields]):
        a, b = ours.fields.get(key, "none"), theirs.fields.get(key, "none")
        if a != b:
            return key, a, b
    return None


def _disagreement(rank: int, ours: Part | None, theirs: Part | None) -> str:
    """The one line naming ``rank``, the file and what differs from rank 0's."""
    if ours is None or theirs is None:
        part = ours or theirs
        holder, other = (rank, 0) if ours is None else (0, rank)
        return f"the ranks disagree: rank {holder} uses a {part.what} that rank {other} does not; {part.fix}"
    key, a, b = first_difference(ours, theirs) or ("", "", "")
    where = f" {theirs.path}" if theirs.path else ""
    base = f" {ours.path}" if ours.path and ours.path != theirs.path else ""
    if not key and b == theirs.path:   # a path compared as itself (an output folder): the paths say it all
        detail = ""
    else:
        detail = f": {key + ' ' if key else ''}{b} on rank {rank}, {a} on rank 0"
    verb = "differ" if theirs.what.endswith("s") and not theirs.what.startswith("config") else "differs"
    return f"the ranks disagree: rank {rank}'s {theirs.what}{where} {verb} from rank 0's{base}{detail}; {theirs.fix}"


def _compare(gathered: list[dict[str, Any]]) -> str | None:
    """The message of the lowest rank whose parts differ from rank 0's, or None when all agree."""
    ours = {p.what: p for p in gathered[0]["parts"]}
    for rank, entry in enumerate(gathered[1:], start=1):
        theirs = {p.what: p for p in entry["parts"]}
        for what in dict.fromkeys([*ours, *theirs]):
            a, b = ours.get(what), theirs.get(what)
            if a is None or b is None or first_difference(a, b) is not None:
                return _disagreement(rank, a, b)
    return None


@contextmanager
def agreement(what: str) -> Iterator[list[Part]]:
    """The start of a distributed job (collective): the body appends this rank's ``Part`` s to the list it is
    given (and may do the checks that precede any work); on exit one all-gather compares every rank's parts with
    rank 0's. A rank whose body raised re-raises its error, the others raise a RuntimeError naming it; parts
    that differ raise the same ``RanksDisagree`` on every rank. Outside a process group of several ranks: the
    body alone."""
    import torch.distributed as dist

    parts: list[Part] = []
    error: BaseException | None = None
    try:
        yield parts
    except Exception as e:  # noqa: BLE001 - re-raised below, once the other ranks know
        error = e
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        if error is not None:
            raise error
        return
    mine = {"parts": parts, "error": None if error is None else f"{type(error).__name__}: {error}"}
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine)
    if error is not None:
        raise error
    failed = next(((r, g["error"]) for r, g in enumerate(gathered) if g["error"]), None)
    if failed is not None:
        raise RuntimeError(f"another rank failed to {what} (rank {failed[0]}: {failed[1]})")
    message = _compare(gathered)
    if message is not None:
        raise RanksDisagree(message)
