"""Texts ``phoenix status`` shares with the drill and the demo (pure). The fault messages are
:mod:`phoenix_hpc.control.fault_text`'s (the journal fold names a dead slot's cause with them)."""

from __future__ import annotations

from phoenix_hpc.control.fault_text import fault_cause, shorten  # noqa: F401 - re-exported

#: The one definition of "replayed" the status, the drill and the demo print (docs/design.md section 2).
REPLAYED_MEANS = ("replayed: completed steps the recovery discarded and trained again (newest live step - the step "
                  "it resumed from; the interrupted step is not counted); at most 2, see docs/design.md section 2")
