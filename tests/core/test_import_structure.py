"""The import structure of ``lsr/``: packages import one another one way only, and nothing but the command line
(and ``python -m lsr``) imports ``lsr.cli``.

Every ``import`` of every module counts, at any depth (a lazy import inside a function is still a dependency),
and so do relative imports. Each module is mapped to its top-level part of ``lsr``: ``lsr/search/kernels/topk.py``
-> ``search``, a single module such as ``lsr/config.py`` -> ``config``, ``lsr/__init__.py`` (the public face) ->
``lsr``.
"""

from __future__ import annotations

import ast
from pathlib import Path

LSR = Path(__file__).resolve().parents[2] / "lsr"
FACE = "lsr"  # lsr/__init__.py and any ``from lsr import <public name>``
CLI_IMPORTERS = {"cli", "__main__"}  # the command line itself and ``python -m lsr``

def _parts(root: Path) -> set[str]:
    """The top-level parts of the package at ``root``: its sub-packages and single modules."""
    return {p.name for p in root.iterdir() if (p / "__init__.py").is_file()} | {
        p.stem for p in root.glob("*.py") if p.stem != "__init__"}


def _part_of(path: Path, root: Path) -> str:
    rel = path.relative_to(root)
    if len(rel.parts) > 1:
        return rel.parts[0]
    return FACE if rel.stem == "__init__" else rel.stem


def _module_name(path: Path, root: Path) -> list[str]:
    """Dotted name parts of the module at ``path`` (``lsr/a/__init__.py`` -> ["lsr", "a"])."""
    parts = ["lsr", *path.relative_to(root).with_suffix("").parts]
    return parts[:-1] if parts[-1] == "__init__" else parts


def imported_modules(path: Path, root: Path = LSR) -> set[str]:
    """Every ``lsr...`` module name that ``path`` imports, at any depth, relative imports resolved; a
    ``from X import name`` also yields ``X.name`` (which is a module when ``name`` is one)."""
    package = _module_name(path, root)
    if path.name != "__init__.py":
        package = package[:-1]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package[: len(package) - (node.level - 1)]
                base = ".".join(up + ([base] if base else []))
            if base != "lsr":  # ``from lsr import config`` imports lsr.config, not the public face
                names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return {n for n in names if n == "lsr" or n.startswith("lsr.")}


def _target_part(module: str, parts: set[str]) -> str:
    pieces = module.split(".")
    return pieces[1] if len(pieces) > 1 and pieces[1] in parts else FACE


def part_imports(root: Path = LSR) -> dict[str, dict[str, str]]:
    """{importing part: {imported part: one file (relative to ``root``) that imports it}}."""
    parts = _parts(root)
    graph: dict[str, dict[str, str]] = {}
    for path in sorted(root.rglob("*.py")):
        source = _part_of(path, root)
        edges = graph.setdefault(source, {})
        for module in imported_modules(path, root):
            target = _target_part(module, parts)
            if target != source:
                edges.setdefault(target, str(path.relative_to(root)))
    return graph


def mutual_pairs(graph: dict[str, dict[str, str]]) -> dict[tuple[str, str], tuple[str, str]]:
    """{(a, b) with a < b that import each other: (a file of a importing b, a file of b importing a)}."""
    return {(a, b): (graph[a][b], graph[b][a]) for a in graph for b in graph[a] if a < b and a in graph.get(b, {})}


def test_the_reader_sees_every_kind_of_import(tmp_path):
    # the guards below are only as good as this reader: absolute, relative, package-relative and lazy imports
    root = tmp_path / "lsr"
    for name in ("alpha", "beta", "gamma"):
        (root / name).mkdir(parents=True)
        (root / name / "__init__.py").write_text("")
    (root / "__init__.py").write_text("")
    (root / "config.py").write_text("")
    (root / "alpha" / "__init__.py").write_text("from . import mod\n")
    (root / "alpha" / "mod.py").write_text("import lsr.beta.x\n\ndef f():\n    from lsr import config\n")
    (root / "beta" / "x.py").write_text("from ..alpha.mod import f\n")
    (root / "gamma" / "y.py").write_text("def g():\n    from lsr import SparseVectors\n")
    assert imported_modules(root / "alpha" / "__init__.py", root) == {"lsr.alpha", "lsr.alpha.mod"}
    assert imported_modules(root / "beta" / "x.py", root) == {"lsr.alpha.mod", "lsr.alpha.mod.f"}
    graph = part_imports(root)
    assert graph["alpha"] == {"beta": "alpha/mod.py", "config": "alpha/mod.py"}
    assert graph["gamma"] == {FACE: "gamma/y.py"}
    assert mutual_pairs(graph) == {("alpha", "beta"): ("alpha/mod.py", "beta/x.py")}


def test_no_stage_package_imports_the_command_line():
    offenders = {part: edges["cli"] for part, edges in part_imports().items()
                 if "cli" in edges and part not in CLI_IMPORTERS}
    assert not offenders, f"only lsr/cli and lsr/__main__.py may import lsr.cli; also: {offenders}"


def test_no_two_packages_import_each_other():
    pairs = mutual_pairs(part_imports())
    assert not pairs, "package pairs that import each other:\n" + "\n".join(
        f"{a} <-> {b} (e.g. lsr/{fa} and lsr/{fb})" for (a, b), (fa, fb) in sorted(pairs.items()))