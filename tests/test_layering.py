"""Guards of the layering rules (docs/architecture.md): the gateway imports only ``protocol/`` and ``util/`` and
loads no torch, zmq or engine; the server never imports the gateway; ``protocol/`` stands on ``util/`` alone."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import omnipipe
from tools.import_cycles import import_graph

SRC = Path(omnipipe.__file__).resolve().parent  # src/omnipipe
GATEWAY_MODULES = ("omnipipe.gateway.app", "omnipipe.gateway.proxy.http", "omnipipe.gateway.proxy.realtime",
                   "omnipipe.gateway.pool")
HEAVY = ("torch", "zmq", "omnipipe.engine", "omnipipe.server")


def omnipipe_imports(package: str) -> dict[str, set[str]]:
    """Module -> the omnipipe modules it imports, for every module of ``omnipipe.<package>`` (the scan ``make lint``'s
    import-cycle check makes: imports anywhere in a file, relative ones resolved)."""
    prefix = f"omnipipe.{package}"
    return {module: targets for module, targets in import_graph(SRC).items()
            if module == prefix or module.startswith(prefix + ".")}


def violations(package: str, allowed: tuple[str, ...]) -> list[str]:
    """``module imports target`` for every import of ``omnipipe.<package>`` outside the ``allowed`` packages."""

    def ok(target: str) -> bool:
        return any(target == a or target.startswith(a + ".") for a in allowed)

    return [f"{module} imports {target}" for module, targets in omnipipe_imports(package).items()
            for target in sorted(targets) if not ok(target)]


def test_import_scan_sees_relative_nested_and_top_level_imports(tmp_path: Path) -> None:
    """The scanner itself: relative imports, imports inside functions and names from ``omnipipe`` all count."""
    package = tmp_path / "omnipipe"
    for module in ("__init__.py", "engine/__init__.py", "engine/orchestrator.py", "server/__init__.py",
                   "server/app.py", "gateway/__init__.py", "gateway/pool.py"):
        (package / module).parent.mkdir(parents=True, exist_ok=True)
        (package / module).write_text("")
    (package / "gateway" / "probe.py").write_text(
        "from . import pool\nfrom omnipipe import AsyncOmni\n\n\n"
        "def f():\n    from ..engine import orchestrator\n    import omnipipe.server.app\n")
    assert import_graph(package)["omnipipe.gateway.probe"] == {
        "omnipipe.gateway.pool", "omnipipe", "omnipipe.engine.orchestrator", "omnipipe.server.app"}


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
