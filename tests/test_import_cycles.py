"""The import-cycle check ``make lint`` runs (tools/import_cycles.py): it fails on a cycle planted in a package and
names its modules in order (whether the cycle closes at the top, under ``if TYPE_CHECKING:``, inside a function or
through a relative import), passes a package without one (a package's ``__init__`` importing its own submodules is
no cycle), and finds none in src/omnipipe."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import omnipipe

TOOL = Path(__file__).resolve().parent.parent / "tools" / "import_cycles.py"
SRC = Path(omnipipe.__file__).resolve().parent  # src/omnipipe


def check(package_dir: Path, *options: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(TOOL), str(package_dir), *options], capture_output=True, text=True,
                          timeout=120, check=False)


def plant(root: Path, files: dict[str, str]) -> Path:
    """A package ``planted`` under ``root`` with ``files`` (path in the package -> source)."""
    package = root / "planted"
    for name, source in files.items():
        path = package / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
    return package


# a package whose __init__ imports its submodules, which import each other one way only (a -> b -> c, and
# sub/__init__ -> sub.leaf), in every form the check reads
ACYCLIC = {
    "__init__.py": "from planted.a import A\nfrom planted.sub import leaf\n\n__all__ = ['A', 'leaf']\n",
    "a.py": "from planted import b\n\nA = b.B\n",
    "b.py": "from .c import C\n\nB = C\n",
    "c.py": "import os\n\nC = os.sep\n",
    "sub/__init__.py": "from . import leaf\n",
    "sub/leaf.py": "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from ..c import C\n",
}


def test_a_package_without_a_cycle_passes(tmp_path: Path) -> None:
    done = check(plant(tmp_path, ACYCLIC))
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip() == "import cycles: none in 6 modules (6 imports between them)"


# c.py importing a back, each way
CLOSING = {
    "at the top": "from planted import a\n",
    "under TYPE_CHECKING": "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from planted.a import A\n",
    "in a function": "def f():\n    from . import a\n    return a\n",
    "by a relative import": "from .a import A\n",
    "by import x.y": "import planted.a\n",
}


@pytest.mark.parametrize("closing", sorted(CLOSING))
def test_a_planted_cycle_fails_and_is_named_in_order(tmp_path: Path, closing: str) -> None:
    """c imports a back (``closing`` it): a -> b -> c -> a."""
    done = check(plant(tmp_path, {**ACYCLIC, "c.py": CLOSING[closing]}))
    assert done.returncode == 1, f"a cycle closed {closing} passed: {done.stdout}"
    assert "  planted.a -> planted.b -> planted.c -> planted.a" in done.stdout.splitlines(), done.stdout


def test_runtime_only_leaves_out_type_checking_and_deferred_imports(tmp_path: Path) -> None:
    typed = plant(tmp_path / "typed", {**ACYCLIC, "c.py": "import typing\n\nif typing.TYPE_CHECKING:\n"
                                                         "    from planted import a\nelse:\n    a = None\n"})
    assert check(typed, "--runtime-only").returncode == 0
    deferred = plant(tmp_path / "deferred", {**ACYCLIC, "c.py": "async def f():\n    import planted.a\n"})
    assert check(deferred, "--runtime-only").returncode == 0
    at_run_time = plant(tmp_path / "else", {**ACYCLIC, "c.py": "from typing import TYPE_CHECKING\n\n"
                                                              "if TYPE_CHECKING:\n    pass\nelse:\n"
                                                              "    from planted import a\n"})
    assert check(at_run_time, "--runtime-only").returncode == 1


def test_a_submodule_importing_its_own_package_is_a_cycle_with_what_the_init_imports(tmp_path: Path) -> None:
    """``from planted import NAME`` (no submodule) in b is an import of planted/__init__, which imports a -> b."""
    done = check(plant(tmp_path, {**ACYCLIC, "__init__.py": "from planted.a import A\n\nNAME = 1\n",
                                  "b.py": "from planted import NAME\nfrom .c import C\n\nB = C\n"}))
    assert done.returncode == 1
    assert "  planted -> planted.a -> planted.b -> planted" in done.stdout.splitlines(), done.stdout


def test_every_module_of_a_mesh_is_on_a_cycle_printed(tmp_path: Path) -> None:
    """A hub every part imports and that imports every part: one cycle through each part, the shortest."""
    parts = {f"p{i}.py": "from planted import hub\n" for i in range(4)}
    done = check(plant(tmp_path, {"__init__.py": "", "hub.py": "from . import p0, p1, p2, p3\n", **parts}))
    assert done.returncode == 1
    cycles = [line.strip() for line in done.stdout.splitlines()[1:]]
    assert cycles == [f"planted.hub -> planted.p{i} -> planted.hub" for i in range(4)]
    assert done.stdout.splitlines()[0] == "import cycles: 4 cycle(s) through 5 modules in 1 group(s):"


def test_src_has_no_import_cycle() -> None:
    done = check(SRC)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("import cycles: none in ")
