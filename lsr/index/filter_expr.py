"""Filter expressions: a small, safe language over an index's metadata columns (``lsr.index.metadata``).

``parse_filter("2010 <= year < 2020 and lang in ['en', 'de']")`` gives a :class:`FilterExpr`; its
``evaluate(table)`` is the boolean mask of the table's rows (documents, in doc-index order) that pass.
The text is parsed with Python's ``ast`` (``mode="eval"``) and only a whitelist of nodes is accepted:
comparisons (``== != < <= > >=``, chained too), ``in`` / ``not in`` a list or tuple of literals, ``is None`` /
``is not None``, ``and`` / ``or`` / ``not``, parentheses, int / float / str / bool / None literals, bare column
names and ``col("odd-name")``. Nothing is ever evaluated by Python: the tree is walked into our own nodes and
computed with ``pyarrow.compute`` (vectorised; tens of milliseconds on millions of rows).

Nulls follow SQL's three-valued logic: a comparison with a null is unknown, ``not`` unknown is unknown,
``False and`` unknown is False, ``True or`` unknown is True, and a row whose whole filter is unknown is
excluded. So ``year != 2020`` and ``not (year > 3)`` both exclude documents without a year; ``year is None``
selects them. ``x in [..., None]`` also matches null rows.

Lives in ``lsr.index`` (no search imports) so that search and serve can both use it; the tree and its
evaluation are ``lsr.index.filter_nodes``.
"""

from __future__ import annotations

import ast
import math

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lsr.index.filter_nodes import (
    BoolOp,
    Cmp,
    Col,
    Evaluation,
    In,
    IsNull,
    Lit,
    Node,
    Not,
    Scalar,
    Truth,
    column_kind,
    render,
    walk_columns,
)

__all__ = ["FilterExpr", "column_kind", "parse_filter"]

_OPS = {ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">="}
_SYMBOLS = {ast.RShift: ">>", ast.LShift: "<<", ast.BitAnd: "&", ast.BitOr: "|", ast.BitXor: "^", ast.Add: "+",
            ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%", ast.Pow: "**",
            ast.MatMult: "@", ast.Invert: "~", ast.UAdd: "+", ast.Is: "is", ast.IsNot: "is not"}
SUPPORTED = "use == != < <= > >= in, not in, is None, is not None, and, or, not"
_INT64 = (-(2 ** 63), 2 ** 63 - 1)
_MAX_DEPTH = 200   # nesting beyond this is no hand-written filter; it would only exhaust the stack


# ---------------------------------------------------------------------------------------------------- parsing
class _Refused(Exception):
    """A piece of the text the language does not accept (becomes the one-line ValueError of parse_filter)."""


def _piece(node: ast.AST) -> str:
    try:
        return ast.unparse(node)
    except Exception:  # noqa: BLE001 - only for the message
        return type(node).__name__


def _operand(node: ast.AST) -> Col | Lit:
    if isinstance(node, ast.Name):
        return Col(node.id)
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "col" and not node.keywords
            and len(node.args) == 1 and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
        return Col(node.args[0].value)
    if isinstance(node, ast.Call):
        raise _Refused(f"{_piece(node)} is not supported (the one call is col(\"column name\"))")
    return Lit(_literal(node))


def _literal(node: ast.AST) -> Scalar:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant) \
            and type(node.operand.value) in (int, float):
        value = -node.operand.value
    elif isinstance(node, ast.Constant):
        value = node.value
    else:
        raise _Refused(_unsupported(node))
    if type(value) not in (int, float, str, bool, type(None)):
        raise _Refused(f"{_piece(node)} is not a literal a filter takes (int, float, str, True, False, None)")
    if type(value) is int and not _INT64[0] <= value <= _INT64[1]:
        raise _Refused(f"{value} is outside the signed 64-bit range")
    if type(value) is float and not math.isfinite(value):
        raise _Refused(f"{_piece(node)} is not a finite number")
    return value


def _unsupported(node: ast.AST) -> str:
    op = getattr(node, "op", None)
    if op is not None and type(op) in _SYMBOLS:
        return f"operator {_SYMBOLS[type(op)]} is not supported ({SUPPORTED})"
    return f"{_piece(node)} is not supported ({SUPPORTED}; literals, column names, col(\"name\"))"


def _condition(node: ast.AST, depth: int = 0) -> Node:
    if depth > _MAX_DEPTH:
        raise _Refused(f"nested more than {_MAX_DEPTH} levels deep")
    if isinstance(node, ast.BoolOp):   # a and (b and c), and chained comparisons in an and: one flat and
        op = "and" if isinstance(node.op, ast.And) else "or"
        parts = [_condition(v, depth + 1) for v in node.values]
        return BoolOp(op, tuple(q for p in parts for q in (p.parts if isinstance(p, BoolOp) and p.op == op else (p,))))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return Not(_condition(node.operand, depth + 1))
    if isinstance(node, ast.Compare):
        return _compare(node)
    if isinstance(node, (ast.Name, ast.Call)):
        operand = _operand(node)
        if isinstance(operand, Col):
            return Truth(operand)
    if isinstance(node, ast.Constant):
        raise _Refused(f"the constant {_piece(node)} is not a condition (compare a column with it)")
    raise _Refused(_unsupported(node))


def _compare(node: ast.Compare) -> Node:
    parts: list[Node] = []
    left = node.left
    for op, right in zip(node.ops, node.comparators):
        parts.append(_pair(left, op, right))
        left = right
    return parts[0] if len(parts) == 1 else BoolOp("and", tuple(parts))


def _pair(left_node: ast.AST, op: ast.cmpop, right_node: ast.AST) -> Node:
    left = _operand(left_node)
    if isinstance(op, (ast.In, ast.NotIn)):
        if not isinstance(left, Col):
            raise _Refused(f"the left side of {'not in' if isinstance(op, ast.NotIn) else 'in'} must be a column, "
                           f"got {_piece(left_node)}")
        if not isinstance(right_node, (ast.List, ast.Tuple, ast.Set)):
            raise _Refused(f"in takes a list of literals such as [1, 2], got {_piece(right_node)}")
        return In(left, tuple(_literal(e) for e in right_node.elts), isinstance(op, ast.NotIn))
    if isinstance(op, (ast.Is, ast.IsNot)):
        if not (isinstance(right_node, ast.Constant) and right_node.value is None) or not isinstance(left, Col):
            raise _Refused(f"{_piece(left_node)} {_SYMBOLS[type(op)]} {_piece(right_node)}: is / is not only test "
                           "a column against None (year is None)")
        return IsNull(left, isinstance(op, ast.IsNot))
    if type(op) not in _OPS:
        raise _Refused(f"operator {type(op).__name__} is not supported ({SUPPORTED})")
    right = _operand(right_node)
    sym = _OPS[type(op)]
    if isinstance(left, Lit) and isinstance(right, Lit):
        raise _Refused(f"{_piece(left_node)} {sym} {_piece(right_node)} compares two constants (name a column)")
    for side in (left, right):
        if isinstance(side, Lit) and side.value is None:
            raise _Refused(f"{sym} None is always unknown; write 'is None' or 'is not None'")
    return Cmp(sym, left, right)


def parse_filter(text: str) -> FilterExpr:
    """Parse a filter expression (grammar: the module docstring; docs/guide/filters.md). A syntax error or a
    piece the language does not accept is a one-line ValueError naming it."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"filter {text!r}: empty; write a condition such as year >= 2010")
    try:
        tree = ast.parse(text.strip(), mode="eval")
        return FilterExpr(_condition(tree.body), text)
    except SyntaxError as e:
        raise ValueError(f"filter {text!r}: not a valid expression ({e.msg}, at character {e.offset or 0})") from None
    except _Refused as e:
        raise ValueError(f"filter {text!r}: {e}") from None
    except (RecursionError, MemoryError):
        raise ValueError(f"filter {text!r}: nested too deeply") from None


class FilterExpr:
    """A parsed filter (``parse_filter``): ``columns()`` it reads, ``check(schema)``, ``evaluate(table)`` -> bool
    mask, and ``str()`` the normalised expression (what ``--explain`` prints)."""

    def __init__(self, root: Node, text: str):
        self.root, self.text = root, text

    def columns(self) -> set[str]:
        """The metadata columns the filter reads."""
        return walk_columns(self.root)

    def check(self, schema: pa.Schema) -> None:
        """Raise the one-line ValueError ``evaluate`` would (unknown column, type mismatch) without computing."""
        Evaluation(self.root, self.text, schema).run(self.root)

    def evaluate(self, table: pa.Table) -> np.ndarray:
        """bool ``[table.num_rows]``: the rows that pass (a row whose filter is unknown through nulls does not)."""
        out = Evaluation(self.root, self.text, table.schema, table).run(self.root)
        if table.num_rows == 0:
            return np.zeros(0, dtype=bool)
        mask = pc.fill_null(out, False)
        if isinstance(mask, pa.ChunkedArray):
            mask = mask.combine_chunks()
        return np.asarray(mask.to_numpy(zero_copy_only=False), dtype=bool)

    def __str__(self) -> str:
        return render(self.root)

    def __repr__(self) -> str:
        return f"FilterExpr({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FilterExpr) and other.root == self.root

    def __hash__(self) -> int:
        return hash(self.root)
