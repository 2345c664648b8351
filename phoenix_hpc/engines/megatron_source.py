"""Check :data:`phoenix_hpc.engines.megatron_version.API` against a megatron-core *source tree* without
importing it (pure Python ``ast``), e.g. the files of a wheel for another Python than this one.

megatron-core 0.17 and later need Python 3.12; this machine's tests run 3.11 with 0.16.1. So that the engine's
calls are known to exist in the newest release the engine claims, a unit test reads that release's wheel
(``scripts/setup.sh`` fetches it into ``.cache/``) and resolves every ``(module, attribute, kind, names)`` of
``API`` in its source: a module attribute is a top-level ``def``, ``class`` or assignment, or a name imported
from another module (followed there); ``kwargs`` are a function's parameters or a class's ``__init__``
parameters or dataclass fields (bases followed); ``methods`` are a class's methods (bases followed). A callable
that takes ``**kwargs`` accepts any keyword, and is reported as such rather than as a match.
"""

from __future__ import annotations

import ast
import zipfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import PurePosixPath


@dataclass(frozen=True)
class SourceTree:
    """The ``.py`` files of a wheel (or any zip) of megatron-core: path inside -> text."""

    files: dict[str, str]

    @classmethod
    def from_wheel(cls, path) -> SourceTree:
        with zipfile.ZipFile(path) as z:
            return cls({n: z.read(n).decode("utf-8") for n in z.namelist() if n.endswith(".py")})

    @classmethod
    def installed(cls) -> SourceTree:
        """The installed megatron-core's ``.py`` files, read through its package metadata (no import).

        Raises:
            importlib.metadata.PackageNotFoundError: megatron-core is not installed."""
        from importlib import metadata

        files = metadata.files("megatron-core") or []
        return cls({str(f): f.read_text(encoding="utf-8") for f in files if str(f).endswith(".py")
                    and str(f).startswith("megatron/")})

    def module_path(self, module: str) -> str | None:
        base = module.replace(".", "/")
        for cand in (f"{base}.py", f"{base}/__init__.py"):
            if cand in self.files:
                return cand
        return None


@lru_cache(maxsize=512)
def _parse(text: str) -> ast.Module:
    return ast.parse(text)


def _absolute(module: str, node: ast.ImportFrom, is_package: bool) -> str:
    if node.level == 0:
        return node.module or ""
    parts = module.split(".")
    keep = len(parts) - node.level + (1 if is_package else 0)
    base = parts[:keep]
    return ".".join(base + ([node.module] if node.module else []))


def resolve(tree: SourceTree, module: str, name: str, depth: int = 0):
    """``(module, node)`` of the definition of ``module.name`` (a FunctionDef, ClassDef or an assignment
    node), following ``from ... import`` re-exports; None when not found."""
    if depth > 12:
        return None
    path = tree.module_path(module)
    if path is None:
        return None
    body = _parse(tree.files[path]).body
    is_package = path.endswith("__init__.py")
    found = None
    for node in _walk_top(body):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            found = (module, node)
        elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            found = (module, node)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name:
            found = (module, node)
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if (alias.asname or alias.name) == name:
                    src = _absolute(module, node, is_package)
                    sub = resolve(tree, src, alias.name, depth + 1)
                    if sub is None and tree.module_path(f"{src}.{alias.name}"):
                        sub = (f"{src}.{alias.name}", None)  # a submodule
                    if sub is not None:
                        found = sub
    if found is None and tree.module_path(f"{module}.{name}"):
        return (f"{module}.{name}", None)
    return found


def _walk_top(body):
    """Top-level statements, including those inside ``try``/``if`` blocks (optional imports)."""
    for node in body:
        if isinstance(node, ast.Try):
            yield from _walk_top(node.body)
            for h in node.handlers:
                yield from _walk_top(h.body)
            yield from _walk_top(node.orelse)
        elif isinstance(node, ast.If):
            yield from _walk_top(node.body)
            yield from _walk_top(node.orelse)
        else:
            yield node


def _params(fn: ast.FunctionDef) -> tuple[set[str], bool]:
    a = fn.args
    names = {x.arg for x in a.posonlyargs + a.args + a.kwonlyargs}
    return names, a.kwarg is not None


def _class_members(tree: SourceTree, module: str, cls: ast.ClassDef, depth: int = 0):
    """``(fields, methods, init)`` of a class with its bases (those resolvable in the tree)."""
    fields: set[str] = set()
    methods: dict[str, ast.FunctionDef] = {}
    for base in cls.bases:
        bname = base.id if isinstance(base, ast.Name) else base.attr if isinstance(base, ast.Attribute) else None
        if bname is None or depth > 8:
            continue
        r = resolve(tree, module, bname)
        if r is not None and isinstance(r[1], ast.ClassDef):
            f, m, _ = _class_members(tree, r[0], r[1], depth + 1)
            fields |= f
            methods.update(m)
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            fields.add(node.target.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            methods[node.name] = node
    return fields, methods, methods.get("__init__")


def check(tree: SourceTree, api) -> list[str]:
    """Problems of ``api`` (``megatron_version.API``'s shape) against ``tree``: one line per missing module,
    attribute, keyword or method; empty when everything resolves."""
    out = []
    for module, attr, kind, names in api:
        if tree.module_path(module) is None:
            out.append(f"{module}: no such module")
            continue
        r = resolve(tree, module, attr)
        if r is None:
            out.append(f"{module}.{attr}: not defined")
            continue
        where, node = r
        if kind == "attr" or not names:
            continue
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            have, any_kw = _params(node)
            missing = [n for n in names if n not in have]
            if missing and not any_kw:
                out.append(f"{module}.{attr}: no keyword {', '.join(missing)}")
        elif isinstance(node, ast.ClassDef):
            fields, methods, init = _class_members(tree, where, node)
            if kind == "methods":
                missing = [n for n in names if n not in methods]
                if missing:
                    out.append(f"{module}.{attr}: no method {', '.join(missing)}")
            else:
                have, any_kw = (_params(init) if init is not None else (set(), False))
                missing = [n for n in names if n not in have and n not in fields]
                if missing and not any_kw:
                    out.append(f"{module}.{attr}: no keyword or field {', '.join(missing)}")
        else:
            out.append(f"{module}.{attr}: {kind} of an assignment cannot be checked from source ({PurePosixPath(where)})")
    return out
