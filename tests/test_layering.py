"""Guards of the layering rules (docs/architecture.md): the gateway imports only ``protocol/`` and ``util/`` and
loads no torch, zmq or engine; the server never imports the gateway; ``protocol/`` stands on ``util/`` alone."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

import omnipipe

SRC = Path(omnipipe.__file__).resolve().parent  # src/omnipipe
GATEWAY_MODULES = ("omnipipe.gateway.app", "omnipipe.gateway.proxy.http", "omnipipe.gateway.proxy.realtime",
                   "omnipipe.gateway.pool")
HEAVY = ("torch", "zmq", "omnipipe.engine", "omnipipe.server")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(path: Path, name: str | None = None) -> set[str]:
    """Every module ``path`` (the module ``name``) imports, anywhere in the file (functions included), relative
    imports resolved."""
    name = name or module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            if target == "omnipipe":  # ``from omnipipe import gateway`` (fine) or ``... import AsyncOmni`` (not)
                found.update(f"omnipipe.{alias.name}" for alias in node.names)
            else:
                found.add(target)
    return found


def omnipipe_imports(package: str) -> dict[str, set[str]]:
    """Module -> the omnipipe modules it imports, for every module of ``omnipipe.<package>``."""
    out: dict[str, set[str]] = {}
    for path in sorted((SRC / package).rglob("*.py")):
        modules = {m for m in imported_modules(path) if m == "omnipipe" or m.startswith("omnipipe.")}
        out[module_name(path)] = modules
    return out


def violations(package: str, allowed: tuple[str, ...]) -> list[str]:
    """``module imports target`` for every import of ``omnipipe.<package>`` outside the ``allowed`` packages."""

    def ok(target: str) -> bool:
        return any(target == a or target.startswith(a + ".") for a in allowed)

    return [f"{module} imports {target}" for module, targets in omnipipe_imports(package).items()
            for target in sorted(targets) if not ok(target)]


def test_import_scan_sees_relative_nested_and_top_level_imports(tmp_path: Path) -> None:
    """The scanner itself: relative imports, imports inside functions and names from ``omnipipe`` all count."""
    probe = tmp_path / "probe.py"
    probe.write_text("from . import pool\nfrom omnipipe import AsyncOmni\n\n\n"
                     "def f():\n    from ..engine import orchestrator\n    import omnipipe.server.app\n")
    assert imported_modules(probe, "omnipipe.gateway.probe") == {
        "omnipipe.gateway", "omnipipe.AsyncOmni", "omnipipe.engine", "omnipipe.server.app"}


@pytest.mark.parametrize("module", GATEWAY_MODULES)
def test_gateway_loads_no_torch_zmq_engine_or_server(module: str) -> None:
    code = (f"import json, sys, {module}\n"
            f"print(json.dumps(sorted(m for m in sys.modules if any(m == h or m.startswith(h + '.') "
            f"for h in {HEAVY!r}))))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    loaded = json.loads(done.stdout.strip().splitlines()[-1])
    assert loaded == [], f"importing {module} loads {loaded}"


def test_server_never_imports_the_gateway() -> None:
    bad = [f"{module} imports {target}" for module, targets in omnipipe_imports("server").items()
           for target in sorted(targets) if target == "omnipipe.gateway" or target.startswith("omnipipe.gateway.")]
    assert bad == []


def test_gateway_imports_only_protocol_util_and_itself() -> None:
    assert violations("gateway", ("omnipipe.protocol", "omnipipe.util", "omnipipe.gateway")) == []


def test_protocol_imports_only_util() -> None:
    assert violations("protocol", ("omnipipe.protocol", "omnipipe.util")) == []


# each core folder with the folders it may import (itself included); nothing above the core (api, models, server,
# gateway, cli, bench, protocol) is reachable from it
CORE_ALLOWED = {
    "transport": ("transport", "util"),
    "chunk": ("chunk", "transport", "util"),
    "config": ("config", "transport", "util"),
    "stage": ("stage", "chunk", "transport", "config", "util"),
    "placement": ("placement", "stage", "transport", "util"),
    "engine": ("engine", "placement", "stage", "chunk", "transport", "config", "util"),
    "util": ("util",),
}


@pytest.mark.parametrize("package", sorted(CORE_ALLOWED))
def test_core_folders_import_nothing_above_them(package: str) -> None:
    assert violations(package, tuple(f"omnipipe.{p}" for p in CORE_ALLOWED[package])) == []


def test_every_module_is_in_the_architecture_layout_table() -> None:
    """docs/architecture.md names every module of src/omnipipe (by its path under src/omnipipe/)."""
    doc = (SRC.parent.parent / "docs" / "architecture.md").read_text()
    modules = [path.relative_to(SRC).as_posix() for path in sorted(SRC.rglob("*.py"))
               if path.name != "__init__.py" or path.read_text().strip().count("\n") > 8]
    missing = [module for module in modules if f"`{module}`" not in doc]
    assert missing == [], f"docs/architecture.md's layout table does not name: {missing}"
