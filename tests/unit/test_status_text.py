"""fault_cause: the cause of a gloo / c10 error, not the path of the file that raised it."""

from __future__ import annotations

from phoenix_hpc.status.text import fault_cause, shorten

GLOO = ("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer "
        "[127.0.0.1]:41234")
C10 = ("[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 30000ms for recv "
       "operation to complete\nException raised from recv at ../torch/csrc/x.cpp:12 (most recent call first):\n"
       "frame #0: c10::Error::Error(...)\n")


def test_gloo_source_location_dropped_cause_kept():
    assert fault_cause("RuntimeError", GLOO) == "RuntimeError: Connection closed by peer [127.0.0.1]:41234"


def test_c10_stack_trailer_dropped():
    assert fault_cause("DistBackendError", C10) == ("DistBackendError: Timed out waiting 30000ms for recv "
                                                    "operation to complete")


def test_plain_messages_unchanged_and_empty_parts_left_out():
    assert fault_cause("ValueError", "bad value [x]") == "ValueError: bad value [x]"
    assert fault_cause("", "process exited") == "process exited"
    assert fault_cause("KeyError", "") == "KeyError"


def test_shorten():
    assert shorten("abc", 5) == "abc"
    assert shorten("abcdefghij", 8) == "abcde..."
