"""launch/heap.py: the long-lived objects are frozen once, later collections skip them, and the pauses are
recorded. Each case runs in a fresh interpreter (freezing is per process and would reach the test runner's)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap


def _run(code: str) -> dict:
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_freezing_once_moves_the_imports_out_of_every_later_collection():
    r = _run("""
        import gc, json, time
        from phoenix_hpc.launch.heap import PAUSES, freeze_long_lived
        PAUSES.install()
        import numpy, torch  # long-lived: modules, classes, functions
        tracked = len(gc.get_objects())
        frozen = freeze_long_lived()
        again = freeze_long_lived()
        class Node:
            pass
        a, b = Node(), Node()
        a.other, b.other = b, a  # cyclic garbage made after the freeze
        import weakref
        w = weakref.ref(a)
        del a, b
        gc.collect()
        print(json.dumps({"tracked": tracked, "frozen": frozen, "again": again, "left": len(gc.get_objects()),
                          "freed": w() is None, "summary": PAUSES.summary()}))
    """)
    assert r["frozen"] > 0.9 * r["tracked"] > 50_000  # torch alone: tens of thousands of objects
    assert r["again"] == 0  # only the first call freezes (a slot back in standby holds old generations' objects)
    assert r["left"] < r["tracked"] / 10  # what a collection still traverses
    assert r["freed"]  # what is made after the freeze is collected as before
    s = r["summary"]
    assert s["frozen"] == r["frozen"] and s["after_freeze"]["collections"] >= 1
    assert s["collections"] >= s["after_freeze"]["collections"] and s["full"] >= 2  # the freeze's and the test's


def test_pauses_are_summed_per_collection_and_unfrozen_processes_say_so():
    r = _run("""
        import gc, json
        from phoenix_hpc.launch.heap import GcPauses
        p = GcPauses()
        p.install()
        p.install()  # idempotent: one callback
        for _ in range(3):
            gc.collect()
        print(json.dumps({"s": p.summary(), "callbacks": sum(1 for c in gc.callbacks if c == p._callback)}))
    """)
    s = r["s"]
    assert r["callbacks"] == 1
    assert s["collections"] == 3 and s["full"] == 3 and s["after_freeze"] is None
    assert 0 < s["max_s"] <= s["total_s"]


def test_a_slot_imports_before_it_freezes_what_its_engine_construction_would_import_later():
    """import_runtime: the first model construction (the meta device, for a joining spare) and the megatron
    engine's megatron-core modules are imported up front, so they are frozen and a recovery does not pay."""
    r = _run("""
        import json, sys
        from types import SimpleNamespace
        from phoenix_hpc.launch.execute import import_runtime
        import_runtime(SimpleNamespace(engine="torch", data=SimpleNamespace(path=None, blend=None, prefixes=[])))
        n = len(sys.modules)
        import torch
        from phoenix_hpc.engines.torch_gpt import GPTShape, empty_stage
        empty_stage(GPTShape(2, 64, 4, 256, 32), 1, 0, torch.float32, torch.device("cpu"))
        torch_new = len(sys.modules) - n
        import_runtime(SimpleNamespace(engine="megatron", data=SimpleNamespace(path=None, blend=None, prefixes=[])))
        print(json.dumps({"torch_new": torch_new, "megatron": "megatron.core.models.gpt" in sys.modules}))
    """)
    assert r["torch_new"] == 0 and r["megatron"]


def test_the_pause_record_survives_collections_during_interpreter_shutdown():
    """Collections run while the interpreter shuts down, when imports fail: the callback must not import."""
    out = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import sys
        from phoenix_hpc.launch.heap import PAUSES
        PAUSES.install()
        class Cycle:
            def __init__(self):
                self.me = self
        keep = [Cycle() for _ in range(1000)]
        sys.modules["time"] = None  # what shutdown does to imports, early
    """)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr


def test_a_user_engine_is_warmed_up_as_the_builtin_engine_it_derives_from():
    """import_runtime chooses the warm-up by the engine's class (factory.engine_family), not by its name."""
    from pathlib import Path

    kit = str(Path(__file__).resolve().parent / "kit_engines")
    r = _run(f"""
        import json, sys
        from types import SimpleNamespace
        from phoenix_hpc.engines.factory import engine_family
        from phoenix_hpc.launch.execute import import_runtime
        cfg = lambda e: SimpleNamespace(engine=e, python_path=[{kit!r}], data=SimpleNamespace(path=None, blend=None, prefixes=[]))
        fam = [engine_family(cfg(e)) for e in ("torch", "megatron", "broken_engines:ClockEngine",
                                               "user_providers:DerivedMegatron")]
        import_runtime(cfg("user_providers:DerivedMegatron"))
        meg = "megatron.core.models.gpt" in sys.modules
        import_runtime(cfg("no_such_module:Engine"))  # left to the engine's construction to report
        print(json.dumps({{"fam": fam, "megatron": meg}}))
    """)
    assert r["fam"] == [[True, False], [False, True], [True, False], [False, True]]
    assert r["megatron"]
