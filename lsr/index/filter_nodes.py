"""The tree of a parsed filter (``lsr.index.filter_expr``), how it prints, and how it is computed over an Arrow
table with ``pyarrow.compute``: column kinds, literals as Arrow scalars, SQL's three-valued logic (a comparison
with a null is unknown; the caller drops unknown rows)."""

from __future__ import annotations

import keyword
import math
from dataclasses import dataclass
from typing import Any, Union

import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["BoolOp", "Cmp", "Col", "Evaluation", "In", "IsNull", "Lit", "Node", "Not", "Scalar", "Truth",
           "column_kind", "render", "walk_columns"]

_ARROW = {"==": "equal", "!=": "not_equal", "<": "less", "<=": "less_equal", ">": "greater", ">=": "greater_equal"}
_FLIP = {"==": "==", "!=": "!=", "<": ">", "<=": ">=", ">": "<", ">=": "<="}
Scalar = Union[int, float, str, bool, None]

# ---------------------------------------------------------------------------------------------------- the tree
@dataclass(frozen=True)
class Col:
    name: str


@dataclass(frozen=True)
class Lit:
    value: Scalar


@dataclass(frozen=True)
class Cmp:
    op: str
    left: Col | Lit
    right: Col | Lit


@dataclass(frozen=True)
class In:
    col: Col
    values: tuple[Scalar, ...]
    negate: bool


@dataclass(frozen=True)
class IsNull:
    col: Col
    negate: bool


@dataclass(frozen=True)
class Truth:   # a bare boolean column used as a condition
    col: Col


@dataclass(frozen=True)
class BoolOp:
    op: str            # "and" | "or"
    parts: tuple[Node, ...]


@dataclass(frozen=True)
class Not:
    part: Node


Node = Union[Cmp, In, IsNull, Truth, BoolOp, Not]


# ---------------------------------------------------------------------------------------------------- rendering
_PREC = {"or": 1, "and": 2, "not": 3}


def _name(col: Col) -> str:
    ok = col.name.isidentifier() and not keyword.iskeyword(col.name) and col.name not in ("True", "False", "None")
    return col.name if ok else f"col({col.name!r})"


def _text(x: Col | Lit) -> str:
    return _name(x) if isinstance(x, Col) else repr(x.value)


def render(node: Node, outer: int = 0) -> str:
    if isinstance(node, BoolOp):
        text, prec = f" {node.op} ".join(render(p, _PREC[node.op] + 1) for p in node.parts), _PREC[node.op]
    elif isinstance(node, Not):   # not (year > 3): parentheses a reader needs, though Python's precedence does not
        inner = render(node.part, _PREC["not"])
        text = f"not {inner}" if isinstance(node.part, (Not, Truth)) or inner.startswith("(") else f"not ({inner})"
        prec = _PREC["not"]
    elif isinstance(node, Cmp):
        return f"{_text(node.left)} {node.op} {_text(node.right)}"
    elif isinstance(node, In):
        return f"{_name(node.col)} {'not in' if node.negate else 'in'} [{', '.join(map(repr, node.values))}]"
    elif isinstance(node, IsNull):
        return f"{_name(node.col)} is {'not ' if node.negate else ''}None"
    else:
        return _name(node.col)
    return f"({text})" if prec < outer else text


def walk_columns(node: Node) -> set[str]:
    if isinstance(node, BoolOp):
        return set().union(*(walk_columns(p) for p in node.parts))
    if isinstance(node, Not):
        return walk_columns(node.part)
    if isinstance(node, Cmp):
        return {x.name for x in (node.left, node.right) if isinstance(x, Col)}
    return {node.col.name}


# ---------------------------------------------------------------------------------------------------- types
def column_kind(t: pa.DataType) -> str | None:
    """The kind of values a filter compares in a column of Arrow type ``t``: "number", "string", "bool",
    "time" (dates, timestamps: compared with ISO strings), "null" (no values), or None (not filterable)."""
    if pa.types.is_dictionary(t):
        return column_kind(t.value_type)
    if pa.types.is_boolean(t):
        return "bool"
    if pa.types.is_integer(t) or pa.types.is_floating(t):
        return "number"
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "string"
    if pa.types.is_timestamp(t) or pa.types.is_date(t):
        return "time"
    if pa.types.is_null(t):
        return "null"
    return None


def _literal_kind(v: Scalar) -> str:
    return "bool" if isinstance(v, bool) else "number" if isinstance(v, (int, float)) else "string"


_KIND_WORDS = {"number": "numbers", "string": "strings", "bool": "booleans", "time": "dates / times"}


def _scalar(v: Scalar, t: pa.DataType) -> pa.Scalar:
    """The literal as an Arrow scalar that compares with a column of type ``t`` the way it reads: a float literal
    in the column's float width (0.1 == a float32 0.1), an ISO string as the column's date / timestamp."""
    if pa.types.is_dictionary(t):
        t = t.value_type
    if isinstance(v, bool) or isinstance(v, str) and not (pa.types.is_timestamp(t) or pa.types.is_date(t)):
        return pa.scalar(v)
    if isinstance(v, str):
        try:
            return pa.scalar(v).cast(t)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            raise ValueError(f"{v!r} is not a date / time of type {t} (write it as '2020-01-31' or "
                             "'2020-01-31 12:00:00')") from None
    if pa.types.is_floating(t):
        return pa.scalar(float(v), t)
    return pa.scalar(v, pa.int64() if isinstance(v, int) else pa.float64())


def _int_vs_float(op: str, x: float) -> tuple[str, int] | bool:
    """``int_column op x`` for a non-integral float ``x`` as a comparison with an integer (exact, where casting the
    column to float64 would round integers above 2**53), or the constant answer of == / !=."""
    if op in ("==", "!="):
        return op == "!="
    lo, hi = math.floor(x), math.ceil(x)
    return {"<": ("<=", lo), "<=": ("<=", lo), ">": (">=", hi), ">=": (">=", hi)}[op]


# ---------------------------------------------------------------------------------------------------- evaluation
class Evaluation:
    """One evaluation (or check, with ``table`` None) of a tree against a table's schema; ``text``: the filter as
    written, for the errors."""

    def __init__(self, root: Node, text: str, schema: pa.Schema, table: pa.Table | None = None):
        self.root, self.text, self.schema, self.table = root, text, schema, table
        self.n = 0 if table is None else table.num_rows

    def fail(self, problem: str, node: Node | None = None) -> ValueError:
        piece = render(node) if node is not None else ""
        where = f"{piece}: " if piece and piece != render(self.root) else ""   # name the piece of a longer filter
        return ValueError(f"filter {self.text!r}: {where}{problem}")

    def kind(self, col: Col) -> str:
        if col.name not in self.schema.names:
            have = ", ".join(self.schema.names) or "none (attach some with lsr index --metadata FILE)"
            raise self.fail(f"no column {col.name!r}; the metadata columns are: {have}")
        kind = column_kind(self.schema.field(col.name).type)
        if kind is None:
            raise self.fail(f"column {col.name!r} has type {self.schema.field(col.name).type}, which filters cannot "
                            "compare (numbers, strings, booleans, dates)")
        return kind

    def array(self, col: Col) -> Any:
        if self.table is None:
            return None
        a = self.table.column(col.name)
        return pc.cast(a, a.type.value_type) if pa.types.is_dictionary(a.type) else a

    def nulls(self) -> Any:
        return None if self.table is None else pa.nulls(self.n, pa.bool_())

    def run(self, node: Node) -> Any:
        if isinstance(node, BoolOp):
            parts = [self.run(p) for p in node.parts]
            if self.table is None:
                return None
            fn = pc.and_kleene if node.op == "and" else pc.or_kleene
            out = parts[0]
            for p in parts[1:]:
                out = fn(out, p)
            return out
        if isinstance(node, Not):
            part = self.run(node.part)
            return None if part is None else pc.invert(part)
        if isinstance(node, Cmp):
            return self.compare(node)
        if isinstance(node, In):
            return self.is_in(node)
        if isinstance(node, IsNull):
            self.kind(node.col)
            a = self.array(node.col)
            return None if a is None else (pc.is_valid(a) if node.negate else pc.is_null(a))
        kind = self.kind(node.col)
        if kind not in ("bool", "null"):
            raise self.fail(f"column {node.col.name!r} holds {_KIND_WORDS[kind]}, not booleans: compare it "
                            f"({_name(node.col)} == ...)")
        return self.nulls() if kind == "null" else self.array(node.col)

    def compare(self, node: Cmp) -> Any:
        left, right, op = node.left, node.right, node.op
        if isinstance(left, Lit):
            left, right, op = right, left, _FLIP[op]
        assert isinstance(left, Col)
        kind = self.kind(left)
        other = self.kind(right) if isinstance(right, Col) else _literal_kind(right.value)
        if kind == "time" and other == "string" and isinstance(right, Lit):
            other = "time"
        if "null" in (kind, other):
            return self.nulls()
        if kind != other:
            what = (f"column {right.name!r} holds {_KIND_WORDS[other]}" if isinstance(right, Col)
                    else f"{right.value!r} is a {'boolean' if other == 'bool' else other}")
            raise self.fail(f"column {left.name!r} holds {_KIND_WORDS[kind]} and {what}", node)
        a = self.array(left)
        if a is None:
            return None
        if isinstance(right, Col):
            b = self.array(right)
            if kind == "number" and a.type != b.type:   # int against float: both as float64
                a, b = pc.cast(a, pa.float64(), safe=False), pc.cast(b, pa.float64(), safe=False)
            return getattr(pc, _ARROW[op])(a, b)
        value = right.value
        if kind == "number" and pa.types.is_integer(a.type) and isinstance(value, float):
            if value.is_integer():
                value = int(value)
            else:
                rule = _int_vs_float(op, value)
                if isinstance(rule, bool):   # == / != a fraction: never / always (unknown on nulls)
                    return pc.if_else(pc.is_null(a), pa.scalar(None, pa.bool_()), rule)
                op, value = rule
        try:
            return getattr(pc, _ARROW[op])(a, _scalar(value, a.type))
        except ValueError as e:
            raise self.fail(str(e), node) from None

    def is_in(self, node: In) -> Any:
        kind = self.kind(node.col)
        values = [v for v in node.values if v is not None]
        for v in values:
            k = _literal_kind(v)
            if kind not in ("null", k) and not (kind == "time" and k == "string"):
                raise self.fail(f"column {node.col.name!r} holds {_KIND_WORDS[kind]} and {v!r} is a "
                                f"{'boolean' if k == 'bool' else k}", node)
        a = self.array(node.col)
        if a is None:
            return None
        if kind == "null":
            hit = pa.nulls(self.n, pa.bool_())
        else:
            if kind == "number" and pa.types.is_integer(a.type):
                values = [int(v) for v in values if float(v).is_integer()]   # 2.5 never equals an integer
            try:
                scalars = [_scalar(v, a.type) for v in values]
            except ValueError as e:
                raise self.fail(str(e), node) from None
            value_set = pa.array([s.as_py() for s in scalars], a.type) if scalars else pa.array([], a.type)
            hit = pc.is_in(a, value_set=value_set, skip_nulls=True)
        on_null = pa.scalar(True if None in node.values else None, pa.bool_())
        hit = pc.if_else(pc.is_null(a), on_null, hit)
        return pc.invert(hit) if node.negate else hit
