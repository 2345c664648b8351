"""Only control/events.py spells a journal event's name: every other module writes an event object and reads
a record's ``event`` against a class's ``NAME``. Checked over the package's source: a journal append with a
name, ``read_journal`` with a name, a record's ``event`` compared with a string, a ``{"event": "..."}``
literal."""

from __future__ import annotations

import ast
from pathlib import Path

from phoenix_hpc.control.events import REGISTRY

PKG = Path(__file__).resolve().parents[2] / "phoenix_hpc"
# model/ sits above control/ in the layering (README "Project layout"), so it cannot import the events: the
# cost model reads ``recovery_done`` records of a journal file by name
ABOVE_CONTROL = {"model/journal.py"}


def _is_event_of_record(node: ast.AST) -> bool:
    """``x["event"]`` or ``x.get("event")``."""
    if isinstance(node, ast.Subscript):
        return isinstance(node.slice, ast.Constant) and node.slice.value == "event"
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
            and bool(node.args) and isinstance(node.args[0], ast.Constant) and node.args[0].value == "event")


def _names_in(node: ast.AST) -> list[str]:
    return [n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and n.value in REGISTRY]


def spelled_names(source: str) -> list[tuple[int, str]]:
    """(line, name) of every event name ``source`` spells where a journal record is written or read."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare) and any(_is_event_of_record(x) for x in [node.left, *node.comparators]):
            out += [(node.lineno, n) for x in [node.left, *node.comparators] for n in _names_in(x)]
        elif isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            arg = None
            if name in ("append", "append_deferred", "write") and "journal" in ast.unparse(f).lower() and node.args:
                arg = node.args[0]  # the event itself (an event object's own fields may hold any words)
            elif name == "read_journal" and len(node.args) > 1:
                arg = node.args[1]
            if isinstance(arg, ast.Constant) and arg.value in REGISTRY:
                out.append((node.lineno, arg.value))
        elif isinstance(node, ast.Dict):
            for k, v in zip(node.keys, node.values):
                if isinstance(k, ast.Constant) and k.value == "event" and v is not None:
                    out += [(node.lineno, n) for n in _names_in(v)]
    return out


def test_the_check_finds_each_way_of_spelling_a_name():
    src = ('journal.append("job_done", step=1)\nself.journal.append_deferred("registered")\n'
           'read_journal(d, "commit")\nr["event"] == "fault"\nr.get("event") in ("slots_dead", x)\n'
           'y = {"event": "inject_fired"}\nr.get("action") == "fallback"\n')
    assert spelled_names(src) == [(1, "job_done"), (2, "registered"), (3, "commit"), (4, "fault"),
                                  (5, "slots_dead"), (6, "inject_fired")]


def test_no_module_but_control_events_spells_an_event_name():
    found = []
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG).as_posix()
        if rel == "control/events.py" or rel in ABOVE_CONTROL:
            continue
        found += [f"phoenix_hpc/{rel}:{line}: {name!r}" for line, name in spelled_names(path.read_text())]
    assert not found, "event names spelled outside control/events.py (use the event class):\n" + "\n".join(found)
