"""A closed protector is freed by reference counting alone (its host buffers go as soon as the last user drops
it), not only by CPython's cyclic garbage collector, which in a rank runs rarely (docs/design.md section 7:
``gc.freeze``): before, the H2H engine held a bound method of its protector, and after every recovery the
previous generation's protector with its host buffers stayed until the next recovery's collection.
Runs in a child process (MPI initialised there as a singleton, COMM_WORLD of size 1; gloo world of size 1)."""

from __future__ import annotations

CHILD = r"""
import gc, weakref
from mpi4py import MPI
from phoenix_hpc.gpucheck import protect

out = {}
for abandon in (False, True):  # the normal end, and a recovery's close (abandon=True)
    prot = protect.make_protector(engine, MPI.COMM_WORLD, torch.device("cpu"))
    train(engine, engine.step + 3, 64, protector=prot, keep=False)
    prot.close(abandon=abandon)
    buf = weakref.ref(prot.buffers.local.bufs[0])
    ref = weakref.ref(prot)
    gc.collect()
    gc.disable()
    del prot
    out[str(abandon)] = [ref() is None, buf() is None]
    gc.enable()
print("RESULT " + json.dumps(out))
"""


def test_a_closed_protector_and_its_buffers_are_freed_without_the_cycle_collector(child_result, torch_engine_child):
    out = child_result(torch_engine_child(2) + CHILD)
    assert out == {"False": [True, True], "True": [True, True]}, out
