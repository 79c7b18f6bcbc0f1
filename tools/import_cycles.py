"""Import cycles among a package's modules (run by ``make lint``): ``python tools/import_cycles.py [PACKAGE_DIR]``.

Every ``.py`` file under ``PACKAGE_DIR`` (default: ``src/omnipipe``) is a module, named by its path (``a/b.py`` is
``omnipipe.a.b``, ``a/__init__.py`` is ``omnipipe.a``), and parsed with ``ast`` (nothing is imported). Module A
imports module M when A holds an import statement that names M:

- ``import omnipipe.a.b`` and ``from omnipipe.a.b import name`` import ``omnipipe.a.b``;
- ``from omnipipe.a import b`` imports ``omnipipe.a.b`` when ``b`` is a module of the package, else ``omnipipe.a``;
- relative imports (``from . import x``, ``from ..a import y``) are resolved against A's package alike;
- a name that is no module of the package (``import omnipipe.a.Thing``) is read as its longest module prefix;
  imports of anything outside the package are left out.

Every import statement in the file counts, wherever it stands:

- under ``if TYPE_CHECKING:``: such an import never runs, so it makes no cycle at run time, but it is a dependency
  all the same (the module is written against the other's types); a package without cycles has none here either;
- inside a function (a deferred import, run when the function is first called): also a dependency, and a cycle
  through it is one the deferral only hides.

``--runtime-only`` leaves out both kinds, to see the cycles that import order alone could break.

Importing ``omnipipe.a.b`` also runs ``omnipipe/__init__.py`` and ``omnipipe/a/__init__.py``; those implicit
imports of the parent packages are not counted (else a package whose ``__init__`` imports its own submodules would
make a cycle with each of them). A package's ``__init__`` counts only for the imports written in it, and a
submodule that imports its own package by name (``from omnipipe.a import name``, ``name`` no module) depends on that
``__init__`` as on any module.

Each cycle is printed as the modules in order (the first again at the end); every module on a cycle is on at least
one cycle printed: for each group of modules that reach each other (a strongly connected component), the shortest
cycle through each of its modules, shortest first, each once. Exit status 1 when there is any cycle, else 0 with a
one-line summary.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import deque
from collections.abc import Iterator
from pathlib import Path

DEFAULT_PACKAGE = Path(__file__).resolve().parent.parent / "src" / "omnipipe"


def module_names(package_dir: Path) -> dict[str, Path]:
    """Every module under ``package_dir`` by its dotted name (the package's own name first)."""
    root = package_dir.parent
    modules: dict[str, Path] = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        if all(part.isidentifier() for part in parts):
            modules[".".join(parts)] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_nodes(tree: ast.Module, runtime_only: bool) -> Iterator[ast.Import | ast.ImportFrom]:
    """The module's import statements (with ``runtime_only``: not those under ``if TYPE_CHECKING:`` nor in
    functions)."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
            continue
        if runtime_only and isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            continue
        if runtime_only and isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)  # the else branch runs
            continue
        stack.extend(ast.iter_child_nodes(node))


def _known(name: str, modules: dict[str, Path]) -> str | None:
    """``name``, or its longest prefix that is a module of the package (None: outside the package)."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in modules:
            return candidate
        parts.pop()
    return None


def imports_of(name: str, path: Path, modules: dict[str, Path], runtime_only: bool = False) -> set[str]:
    """The package's modules that module ``name`` (at ``path``) imports (itself left out)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in _import_nodes(ast.parse(path.read_text(), filename=str(path)), runtime_only):
        targets: list[str | None] = []
        if isinstance(node, ast.Import):
            targets = [_known(alias.name, modules) for alias in node.names]
        else:
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                source = ".".join([*base, node.module] if node.module else base)
            else:
                source = node.module or ""
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                targets.append(submodule if submodule in modules else _known(source, modules))
        found.update(target for target in targets if target is not None and target != name)
    return found


def import_graph(package_dir: Path, runtime_only: bool = False) -> dict[str, set[str]]:
    """Module -> the package's modules it imports, for every module under ``package_dir``."""
    modules = module_names(package_dir)
    return {name: imports_of(name, path, modules, runtime_only) for name, path in modules.items()}


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of two or more modules that each reach all the others (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    groups: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                group: list[str] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    groups.append(sorted(group))
    return sorted(groups)


def _shortest_cycle(graph: dict[str, set[str]], start: str, group: set[str]) -> list[str]:
    """The shortest path from ``start`` back to itself within ``group`` (breadth first, names in order)."""
    came_from: dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for child in sorted(graph[node] & group):
            if child == start:
                path = [node]
                while path[-1] != start:
                    path.append(came_from[path[-1]])
                return [*reversed(path), start]
            if child not in came_from:
                came_from[child] = node
                queue.append(child)
    raise AssertionError(f"{start} is on no cycle of its group")


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Cycles covering every module on any cycle: per group, the shortest cycle through each of its modules (each
    cycle once, written from its first module by name), shortest first."""
    cycles: list[list[str]] = []
    for group in strongly_connected(graph):
        members = set(group)
        seen: set[tuple[str, ...]] = set()
        found: list[list[str]] = []
        for module in group:
            cycle = _shortest_cycle(graph, module, members)[:-1]
            first = cycle.index(min(cycle))
            cycle = cycle[first:] + cycle[:first]
            if tuple(cycle) not in seen:
                seen.add(tuple(cycle))
                found.append([*cycle, cycle[0]])
        cycles += sorted(found, key=lambda c: (len(c), c))
    return cycles


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("package_dir", nargs="?", type=Path, default=DEFAULT_PACKAGE,
                        help="the package's folder (default: src/omnipipe)")
    parser.add_argument("--runtime-only", action="store_true",
                        help="leave out imports under `if TYPE_CHECKING:` and inside functions")
    args = parser.parse_args(argv)
    graph = import_graph(args.package_dir, args.runtime_only)
    cycles = find_cycles(graph)
    edges = sum(len(targets) for targets in graph.values())
    if not cycles:
        print(f"import cycles: none in {len(graph)} modules ({edges} imports between them)")
        return 0
    groups = strongly_connected(graph)
    print(f"import cycles: {len(cycles)} cycle(s) through {sum(len(g) for g in groups)} modules "
          f"in {len(groups)} group(s):")
    for cycle in cycles:
        print("  " + " -> ".join(cycle))
    return 1


if __name__ == "__main__":
    sys.exit(main())
