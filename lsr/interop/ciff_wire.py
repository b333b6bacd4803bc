"""The CIFF wire format: the protobuf schema and the varint-length-prefixed message stream.

A CIFF file is one ``Header``, then exactly ``num_postings_lists`` ``PostingsList`` messages, then exactly
``num_doc_records`` ``DocRecord`` messages (upstream calls the field ``num_docs``), each preceded by its
byte length as a varint. The schema (osirrc/ciff ``CommonIndexFileFormat.proto``, package
``io.osirrc.ciff``) is declared with protobuf's runtime descriptor API in a private descriptor pool, so
no generated code is needed.

Every length read here is checked before anything is allocated: a frame is read in bounded chunks (or
against the known bytes left), so a length prefix of 100 GB or 2**63 in a small file fails as a
truncated file instead of a ``MemoryError`` / ``OverflowError``.
"""

from __future__ import annotations

import json
import re
from typing import IO, Any

__all__ = ["CIFF_VERSION", "lsr_description", "messages", "parse_message", "read_delimited", "read_frame",
           "write_delimited"]

CIFF_VERSION = 1
_LSR_DESCRIPTION = re.compile(r"lsr=(\{.*\})\s*$", re.DOTALL)
_MAX_VARINT_BYTES = 10
_READ_CHUNK = 1 << 26  # a frame of unknown honesty is read this much at a time: memory follows the real bytes
_FIELDS = {  # message -> [(name, number, protobuf FieldDescriptorProto type name, repeated message type)]
    "Header": [("version", 1, "INT32"), ("num_postings_lists", 2, "INT32"), ("num_doc_records", 3, "INT32"),
               ("total_postings_lists", 4, "INT32"), ("total_docs", 5, "INT32"),
               ("total_terms_in_collection", 6, "INT64"), ("average_doclength", 7, "DOUBLE"),
               ("description", 8, "STRING")],
    "Posting": [("docid", 1, "INT32"), ("tf", 2, "INT32")],
    "PostingsList": [("term", 1, "STRING"), ("df", 2, "INT64"), ("cf", 3, "INT64"), ("postings", 4, "Posting")],
    "DocRecord": [("docid", 1, "INT32"), ("collection_docid", 2, "STRING"), ("doclength", 3, "INT32")],
}
_messages: dict[str, Any] = {}


def messages() -> dict[str, Any]:
    """The CIFF message classes (Header, Posting, PostingsList, DocRecord), built once."""
    if _messages:
        return _messages
    try:
        from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
    except ImportError:
        raise ImportError("CIFF needs protobuf: pip install 'lsr-gpu[ciff]'") from None
    proto = descriptor_pb2.FileDescriptorProto(name="lsr_ciff.proto", package="io.osirrc.ciff", syntax="proto3")
    F = descriptor_pb2.FieldDescriptorProto
    for name, fields in _FIELDS.items():
        msg = proto.message_type.add(name=name)
        for field, number, kind in fields:
            if kind in _FIELDS:  # a repeated sub-message
                msg.field.add(name=field, number=number, label=F.LABEL_REPEATED, type=F.TYPE_MESSAGE,
                              type_name=f".io.osirrc.ciff.{kind}")
            else:
                msg.field.add(name=field, number=number, label=F.LABEL_OPTIONAL, type=getattr(F, f"TYPE_{kind}"))
    pool = descriptor_pool.DescriptorPool()  # private: never clashes with another CIFF module's classes
    pool.Add(proto)
    for name in _FIELDS:
        _messages[name] = message_factory.GetMessageClass(pool.FindMessageTypeByName(f"io.osirrc.ciff.{name}"))
    return _messages


def lsr_description(header: Any) -> dict[str, Any]:
    """The ``lsr={...}`` JSON an lsr export appends to the header's description ({} for other files)."""
    found = _LSR_DESCRIPTION.search(header.description)
    if not found:
        return {}
    try:
        info = json.loads(found.group(1))
    except json.JSONDecodeError as e:
        raise ValueError(f"header: the lsr={{...}} part of the description is not JSON ({e})") from None
    if not isinstance(info, dict):
        raise ValueError("header: the lsr={...} part of the description is not a JSON object")
    return info


def write_delimited(fh: IO[bytes], message: Any) -> None:
    """One message (or its serialized bytes) with its varint length prefix."""
    data = message if isinstance(message, bytes) else message.SerializeToString()
    n, prefix = len(data), bytearray()
    while n >= 0x80:
        prefix.append((n & 0x7F) | 0x80)
        n >>= 7
    prefix.append(n)
    fh.write(bytes(prefix))
    fh.write(data)


def _read_length(fh: IO[bytes], what: str) -> tuple[int, int]:
    """The varint length prefix before ``what`` and its size in bytes."""
    n = 0
    for i in range(_MAX_VARINT_BYTES):
        b = fh.read(1)
        if not b:
            raise ValueError(f"the file ends before {what} (truncated, or the header's counts are too large)")
        n |= (b[0] & 0x7F) << (7 * i)
        if not b[0] & 0x80:
            return n, i + 1
    raise ValueError(f"{what}: the length prefix is longer than {_MAX_VARINT_BYTES} bytes (not a CIFF file)")


def read_frame(fh: IO[bytes], what: str, left: int | None = None) -> tuple[bytes, int]:
    """The bytes of the next message (named ``what`` in errors) and how many bytes it took with its prefix.

    ``left``: the bytes the file holds from here, when known; a length prefix beyond it is refused
    before reading. Otherwise the frame is read in chunks, so a lying prefix costs no more memory than
    the bytes the file really has."""
    n, used = _read_length(fh, what)
    if left is not None and n > left - used:
        raise ValueError(f"{what}: length prefix {n} exceeds the {max(left - used, 0)} bytes left in the file "
                         "(truncated or not a CIFF file)")
    parts, got = [], 0
    while got < n:
        chunk = fh.read(min(n - got, _READ_CHUNK))
        if not chunk:
            raise ValueError(f"{what}: length prefix {n} but the file ends after {got} bytes (truncated)")
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts), used + n


def parse_message(cls: Any, data: bytes, what: str) -> Any:
    """``data`` parsed as a ``cls`` message (ValueError naming ``what`` when it is not one).

    protobuf keeps fields it does not know (or of the wrong wire type) as unknown fields instead of
    failing, so a PostingsList read where a DocRecord belongs parses; any unknown field is refused."""
    msg = cls()
    try:
        msg.ParseFromString(data)
    except Exception as e:  # noqa: BLE001 - protobuf's DecodeError type differs between implementations
        raise ValueError(f"{what} is not a valid CIFF message ({e}): not a CIFF file?") from None
    size = msg.ByteSize()
    msg.DiscardUnknownFields()
    if msg.ByteSize() != size:
        name = cls.DESCRIPTOR.name
        raise ValueError(f"{what} holds fields a CIFF {name} does not have: not a {name} (are the header's "
                         "num_postings_lists / num_doc_records right?)")
    return msg


def read_delimited(fh: IO[bytes], cls: Any, what: str = "a message") -> Any:
    """The next length-prefixed message of class ``cls`` (ValueError naming ``what`` when absent or bad)."""
    return parse_message(cls, read_frame(fh, what)[0], what)
