"""The package's layering is what the README says: its "Project layout" lists phoenix_hpc's folders and
top-level modules in dependency order, "each folder depends only on those above it". Every reference is
checked -- imports at module level *and inside functions* (a lazy import hides a cycle as well as it hides
the cost), and modules loaded by name (``importlib.import_module("phoenix_hpc....")``, ``find_spec``, and
``"phoenix_hpc.x.y:attr"`` tables). ``python -m`` targets in command lines start another process and are
not references."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "phoenix_hpc"
SENTENCE = "each folder depends only on those above it"
_BY_NAME = re.compile(r"^phoenix_hpc(\.\w+)+(:\w+)?$")


def layout_order(readme: str) -> list[str]:
    """The folders and top-level modules under ``phoenix_hpc/`` in the README's layout block, in order."""
    block = readme.split("## Project layout", 1)[1].split("```", 2)[1]
    lines = block.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("phoenix_hpc/"))
    assert SENTENCE in lines[head], lines[head]
    units = []
    for line in lines[head + 1:]:
        if not line.startswith("  "):
            break
        m = re.match(r"^  (\w+)(/|\.py)\s", line)
        if m:
            units.append(m.group(1))
    return units


def _unit(module: str) -> str | None:
    """The layout unit of a dotted module name under phoenix_hpc (``None``: the package root)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "phoenix_hpc" else None


def references(source: str) -> list[tuple[int, str]]:
    """(line, dotted module) of every phoenix_hpc module ``source`` refers to, at any depth."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.startswith("phoenix_hpc")]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "phoenix_hpc":  # from phoenix_hpc import errors, __version__
                out += [(node.lineno, f"phoenix_hpc.{a.name}") for a in node.names]
            elif node.module.startswith("phoenix_hpc."):
                out.append((node.lineno, node.module))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _BY_NAME.match(node.value):
            if ":" in node.value:
                out.append((node.lineno, node.value.split(":")[0]))
        elif isinstance(node, ast.Call):
            name = getattr(node.func, "attr", getattr(node.func, "id", ""))
            if name in ("import_module", "find_spec") and node.args:
                arg = node.args[0]
                text = arg.value if isinstance(arg, ast.Constant) else (
                    arg.values[0].value if isinstance(arg, ast.JoinedStr) and arg.values
                    and isinstance(arg.values[0], ast.Constant) else "")
                if isinstance(text, str) and text.startswith("phoenix_hpc."):
                    out.append((node.lineno, text.rstrip(".")))
    return out


def violations(order: list[str], files: dict[str, str]) -> list[str]:
    """Each reference from a unit to one listed at or below it (``files``: path under phoenix_hpc -> text)."""
    rank = {u: i for i, u in enumerate(order)}
    bad = []
    for rel, text in sorted(files.items()):
        src = Path(rel).parts[0].removesuffix(".py")
        if src == "__init__":
            continue
        for line, module in references(text):
            dst = _unit(module)
            if dst is None or dst == src or dst not in rank:  # the package root (__version__), or itself
                continue
            if src not in rank or rank[dst] > rank[src]:
                bad.append(f"phoenix_hpc/{rel}:{line}: {src} -> {dst} ({module})")
    return bad


def _package_files() -> dict[str, str]:
    return {str(p.relative_to(PKG)): p.read_text() for p in PKG.rglob("*.py")}


def test_the_readme_lists_every_folder_and_top_level_module_once():
    order = layout_order((ROOT / "README.md").read_text())
    units = {p.name for p in PKG.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    units |= {p.stem for p in PKG.glob("*.py") if p.stem != "__init__"}
    assert sorted(order) == sorted(units), (sorted(set(units) - set(order)), sorted(set(order) - set(units)))


def test_each_folder_depends_only_on_those_above_it():
    order = layout_order((ROOT / "README.md").read_text())
    bad = violations(order, _package_files())
    assert not bad, "references against the README's layout order:\n" + "\n".join(bad)


def test_the_check_sees_function_level_imports_and_imports_by_name():
    order = ["errors", "config", "control"]
    lazy = "def f():\n    from phoenix_hpc.control.journal import read_journal\n"
    assert violations(order, {"config/load.py": lazy}) == [
        "phoenix_hpc/config/load.py:2: config -> control (phoenix_hpc.control.journal)"]
    assert violations(order, {"errors.py": "import phoenix_hpc.config.schema\n"})
    by_name = 'import importlib\nm = importlib.import_module("phoenix_hpc.control.coordinator")\n'
    assert violations(order, {"config/x.py": by_name})
    assert violations(order, {"errors.py": 'T = {"a": "phoenix_hpc.config.schema:JobConfig"}\n'})
    assert not violations(order, {"control/x.py": lazy + "import phoenix_hpc.errors\n"})
    assert not violations(order, {"config/x.py": 'CMD = "python -m phoenix_hpc.control.coordinator"\n'})
    # a unit the README does not list cannot import anything listed
    assert violations(order, {"newfolder/x.py": "from phoenix_hpc.errors import ConfigError\n"})
