"""What identifies an index folder for the agreement of a distributed job (``lsr.parallel.agreement``): its layout,
counts and recorded checksums. Apart from the agreement, since it reads both index layouts and the sharded one's
build itself agrees through ``lsr.parallel.agreement``."""

from __future__ import annotations

import os
from pathlib import Path

from lsr.parallel.agreement import Part, file_digest

__all__ = ["index_parts"]


def index_parts(path: str | os.PathLike) -> list[Part]:
    """An index folder, plain or sharded: its layout and counts, then the checksums its meta.json or sharded
    manifest records (so another build of the same shape differs), then those files' own hashes."""
    from lsr.index.inverted import InvertedIndex
    from lsr.parallel.sharded_index import is_sharded, read_sharded_manifest

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
