"""Leave a step's compute once the coordinator has ended the generation (docs/design.md section 12).

When the quiesce watchdog hears a ``quiesce`` or ``stop`` it aborts the generation's communicators
(:mod:`phoenix_hpc.launch.abort`), so the training thread fails at its next collective. A rank that is
computing when the quiesce arrives only gets there once its compute reaches that collective: with the
torch engine at pp=1, the end of the step's forward and backward. That wait grows with the model's
compute per step, and every recovery waits for the slowest survivor's ``quiesced``.

:class:`ComputeInterrupt` shortens it. After the abort the watchdog calls :meth:`ComputeInterrupt.interrupt`:

- **forward**: it registers a global ``torch.nn.Module`` forward pre-hook
  (``torch.nn.modules.module.register_module_forward_pre_hook``) that raises :class:`StepInterrupted` in the
  training thread at its next module call. It exists only from the interrupt until the step is left: a
  global hook registered for the whole run would take every module call off PyTorch's fast path.
- **backward**: a backward pass cannot be given hooks safely while it runs, so :data:`BACKWARD_CHECKS` of the
  engine's leaf parameters (:meth:`phoenix_hpc.engines.base.Engine.autograd_parameters`), spaced by their
  element count (:func:`spaced`), carry a post-accumulate-grad hook
  (``Tensor.register_post_accumulate_grad_hook``) from the first step on; it compares one attribute and
  returns until an interrupt was requested, then raises, and the backward ends at the next hooked parameter
  whose gradient is complete. An idle hook call costs about 0.1-0.15 us of thread CPU, so 8 of them are
  0.01 % of the benchmark model S's forward + backward (``python -m phoenix_hpc.bench.interrupt_cost``). It raises in whatever thread runs the backward (autograd runs a CUDA backward in its
  device threads and passes the error to the caller of ``backward()``). An engine that lists no parameters
  finishes a running backward first.

The member treats :class:`StepInterrupted`, like the failed collective, as the quiesce it is. The step is
abandoned either way: the optimizer has not run (a quiesce inside ``optimizer_step`` finds no module call or
backward there, and the step is ``dirty`` as before), and the gradients are set to None when the next step
starts.

The hooks raise only between :meth:`ComputeInterrupt.open` and :meth:`ComputeInterrupt.close` (the
training thread's steps of one generation) and only after an :meth:`~ComputeInterrupt.interrupt` for that
generation; ``close`` removes the forward hook. An ``interrupt`` outside the window or for another generation
(a late firing of the watchdog) does nothing. At pp > 1 the pipeline schedule may re-raise the error as a
``RuntimeError``; the member does not rely on the type (the watchdog's firing tells it the error was the
quiesce).
"""

from __future__ import annotations

import threading
import time
import weakref


#: Parameters per engine that carry the backward hook: a running backward is left within about 1/8 of it.
BACKWARD_CHECKS = 8


def spaced(numels: list[int], n: int) -> list[int]:
    """Indices of at most ``n`` of the parameters with element counts ``numels`` (in the model's order),
    one where the running element count first reaches each of ``1/n, 2/n, ..., n/n`` of the total (pure).
    The backward pass visits parameters roughly in reverse order and spends time roughly in proportion to
    their elements, so the hooked ones split it into about ``n`` even parts."""
    total = sum(numels)
    if n < 1 or total <= 0:
        return []
    out: list[int] = []
    run, k = 0, 1
    for i, x in enumerate(numels):
        run += x
        if run * n >= k * total:
            out.append(i)
            while k <= n and run * n >= k * total:
                k += 1
    return out


class StepInterrupted(RuntimeError):
    """Raised at a module call of the training thread or at a completed parameter gradient of its backward
    pass, after the coordinator ended the generation."""


class ComputeInterrupt:
    """The training thread's step window and the hooks that end its compute (module doc). Thread-safe."""

    def __init__(self):
        self._lock = threading.Lock()
        self._thread: int | None = None  # threading.get_ident() of the training thread while the window is open
        self._generation: int | None = None  # the generation whose steps the window covers
        self._handle = None  # the forward hook's RemovableHandle, after an interrupt in the window
        self._requested = False  # read by the backward hooks without the lock (one attribute load)
        self._grad_handles: list = []  # the backward hooks of the hooked parameters
        self._hooked: list[weakref.ref] = []  # the parameters last given to open(), in order
        self.reason: str | None = None
        self.at: float | None = None  # time.perf_counter() of the interrupt, while the window is open

    def open(self, generation: int, params: list | None = None) -> None:
        """From the training thread, before the steps of ``generation``: from now on an :meth:`interrupt` for
        it takes effect. The trainable ones of ``params`` (the engine's
        :meth:`~phoenix_hpc.engines.base.Engine.autograd_parameters`; a frozen parameter takes no hook) get
        the backward hooks (:func:`spaced`), unless they have them already; earlier parameters lose theirs."""
        params = [p for p in (params or []) if p.requires_grad]
        if len(params) != len(self._hooked) or any(r() is not p for r, p in zip(self._hooked, params)):
            for h in self._grad_handles:
                h.remove()
            self._grad_handles = [params[i].register_post_accumulate_grad_hook(self._grad_hook)
                                  for i in spaced([p.numel() for p in params], BACKWARD_CHECKS)]
            self._hooked = [weakref.ref(p) for p in params]
        with self._lock:
            self._thread, self._generation = threading.get_ident(), int(generation)
            self.reason, self.at, self._requested = None, None, False

    def close(self) -> float | None:
        """End the window and remove the forward hook (idempotent). Returns the :func:`time.perf_counter` at
        which an interrupt was requested in the window, or None."""
        with self._lock:
            handle, self._handle, self._thread, self._generation, self._requested = self._handle, None, None, None, False
            at, self.at = self.at, None
        if handle is not None:
            handle.remove()
        return at

    def interrupt(self, generation: int, reason: str) -> bool:
        """Any thread: end the step of ``generation``'s window at its next module call or hooked parameter
        gradient. Returns False (and does nothing) outside a window, for another generation's window (a late
        call after the training thread moved on) or when already requested."""
        from torch.nn.modules.module import register_module_forward_pre_hook

        with self._lock:
            if self._thread is None or self._generation != generation or self._handle is not None:
                return False
            self.reason, self.at = reason, time.perf_counter()
            self._handle = register_module_forward_pre_hook(self._forward_hook)
            self._requested = True
            return True

    def _forward_hook(self, module, args) -> None:
        if threading.get_ident() == self._thread:
            raise StepInterrupted(f"{self.reason}: the step was left at a call of {type(module).__name__}")

    def _grad_hook(self, param) -> None:
        if self._requested:
            raise StepInterrupted(f"{self.reason}: the step was left in the backward pass, at a parameter of "
                                  f"shape {tuple(param.shape)}")
