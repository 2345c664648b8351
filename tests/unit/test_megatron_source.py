"""The Megatron engine's megatron-core calls (megatron_version.API) exist in the newest release it claims,
0.19.2, read from that wheel's source without importing it (it needs Python 3.12), and in the installed one
read the same way; the source reader finds what is missing."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import pytest

from phoenix_hpc.engines import megatron_version as mv
from phoenix_hpc.engines.megatron_source import SourceTree, check

ROOT = Path(__file__).resolve().parents[2]


def newest_wheel() -> Path:
    found = sorted((ROOT / mv.WHEEL_DIR).glob(f"megatron_core-{mv.NEWEST_CHECKED}-*.whl"))
    assert found, (f"no megatron-core {mv.NEWEST_CHECKED} wheel in {mv.WHEEL_DIR}/: scripts/setup.sh fetches it "
                   "(scripts/test.sh runs it first)")
    return found[-1]


def test_every_name_the_engine_calls_is_in_the_newest_release_source():
    tree = SourceTree.from_wheel(newest_wheel())
    assert "megatron/core/package_info.py" in tree.files
    assert f"MINOR = {mv.NEWEST_CHECKED.split('.')[1]}" in tree.files["megatron/core/package_info.py"]
    assert check(tree, mv.API) == []


def test_every_name_is_in_the_installed_release_source_too():
    assert check(SourceTree.installed(), mv.API) == []


def test_the_newest_checked_release_is_inside_the_supported_range():
    assert mv.version_problem(mv.NEWEST_CHECKED) is None


def _tree(files: dict[str, str]) -> SourceTree:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
    buf.seek(0)
    return SourceTree.from_wheel(buf)


def test_missing_attributes_keywords_and_methods_are_reported():
    tree = _tree({
        "pkg/__init__.py": "from .impl import Config, run\ntry:\n    from .opt import Fast\nexcept ImportError:\n    pass\n",
        "pkg/impl.py": ("from dataclasses import dataclass\n@dataclass\nclass Base:\n    a: int = 1\n"
                        "    def step(self): ...\n@dataclass\nclass Config(Base):\n    b: int = 2\n"
                        "def run(x, *, y=1): ...\ndef loose(**kw): ...\n"),
        "pkg/opt.py": "class Fast:\n    def go(self): ...\n",
    })
    api = (("pkg", "Config", "kwargs", ("a", "b", "c")), ("pkg", "Config", "methods", ("step", "stop")),
           ("pkg", "run", "kwargs", ("x", "y", "z")), ("pkg.impl", "loose", "kwargs", ("anything",)),
           ("pkg", "Fast", "methods", ("go",)), ("pkg", "gone", "attr", ()), ("nopkg", "x", "attr", ()))
    assert check(tree, api) == ["pkg.Config: no keyword or field c", "pkg.Config: no method stop",
                                "pkg.run: no keyword z", "pkg.gone: not defined", "nopkg: no such module"]


def test_a_name_renamed_in_the_wheel_is_caught():
    tree = SourceTree.from_wheel(newest_wheel())
    api = (("megatron.core.optimizer", "OptimizerConfig", "kwargs", ("adam_beta1", "adam_beta_one")),
           ("megatron.core.parallel_state", "initialize_model_parallel_v2", "attr", ()))
    problems = check(tree, api)
    assert len(problems) == 2 and "adam_beta_one" in problems[0] and "initialize_model_parallel_v2" in problems[1]
