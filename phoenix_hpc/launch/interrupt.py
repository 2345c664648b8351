"""Leave a step's compute once the coordinator has ended the generation (docs/design.md section 12).

When the quiesce watchdog hears a ``quiesce`` or ``stop`` it aborts the generation's communicators
(:mod:`phoenix_hpc.launch.abort`), so the training thread fails at its next collective. A rank that is
computing when the quiesce arrives only gets there once its compute reaches that collective: with the
torch engine at pp=1, the end of the step's forward and backward. That wait grows with the model's
compute per step, and every recovery waits for the slowest survivor's ``quiesced``.

:class:`ComputeInterrupt` shortens it. After the abort the watchdog calls :meth:`ComputeInterrupt.interrupt`,
which registers a global ``torch.nn.Module`` forward pre-hook
(``torch.nn.modules.module.register_module_forward_pre_hook``) that raises :class:`StepInterrupted` in the
training thread at its next module call. The hook exists only from the interrupt until the step is left:
registered for the whole run, it would take every module call off PyTorch's fast path. A backward pass
already running finishes first (hooks cannot be added to a running backward safely); the next forward or
collective ends the step. Hooks registered on parameters from the start would end a running backward too,
but every call of one takes the GIL inside the backward (on a CUDA device thread as well) while the
runtime's own Python threads hold it for much of the step, so they are not used (docs/design.md section 12
has the measurements).

The member treats :class:`StepInterrupted`, like the failed collective, as the quiesce it is. The step is
abandoned either way: the optimizer has not run (a quiesce inside ``optimizer_step`` finds no module call
there, and the step is ``dirty`` as before), and the gradients are set to None when the next step starts.

The hook raises only between :meth:`ComputeInterrupt.open` and :meth:`ComputeInterrupt.close` (the
training thread's steps of one generation), only in that thread, and only after an
:meth:`~ComputeInterrupt.interrupt` for that generation; ``close`` removes it. An ``interrupt`` outside the
window or for another generation (a late firing of the watchdog) does nothing. At pp > 1 the pipeline
schedule may re-raise the error as a ``RuntimeError``; the member does not rely on the type (the watchdog's
firing tells it the error was the quiesce).
"""

from __future__ import annotations

import threading
import time


class StepInterrupted(RuntimeError):
    """Raised at a module call of the training thread after the coordinator ended the generation."""


class ComputeInterrupt:
    """The training thread's step window and the hook that ends its compute (module doc). Thread-safe."""

    def __init__(self):
        self._lock = threading.Lock()
        self._thread: int | None = None  # threading.get_ident() of the training thread while the window is open
        self._generation: int | None = None  # the generation whose steps the window covers
        self._handle = None  # the forward hook's RemovableHandle, after an interrupt in the window
        self.reason: str | None = None
        self.at: float | None = None  # time.perf_counter() of the interrupt, while the window is open

    def open(self, generation: int) -> None:
        """From the training thread, before the steps of ``generation``: from now on an :meth:`interrupt` for
        it takes effect in this thread."""
        with self._lock:
            self._thread, self._generation = threading.get_ident(), int(generation)
            self.reason, self.at = None, None

    def close(self) -> float | None:
        """End the window and remove the forward hook (idempotent). Returns the :func:`time.perf_counter` at
        which an interrupt was requested in the window, or None."""
        with self._lock:
            handle, self._handle, self._thread, self._generation = self._handle, None, None, None
            at, self.at = self.at, None
        if handle is not None:
            handle.remove()
        return at

    def interrupt(self, generation: int, reason: str) -> bool:
        """Any thread: end the step of ``generation``'s window at its next module call. Returns False (and
        does nothing) outside a window, for another generation's window (a late call after the training
        thread moved on) or when already requested."""
        from torch.nn.modules.module import register_module_forward_pre_hook

        with self._lock:
            if self._thread is None or self._generation != generation or self._handle is not None:
                return False
            self.reason, self.at = reason, time.perf_counter()
            self._handle = register_module_forward_pre_hook(self._forward_hook)
            return True

    def _forward_hook(self, module, args) -> None:
        if threading.get_ident() == self._thread:
            raise StepInterrupted(f"{self.reason}: the step was left at a call of {type(module).__name__}")
