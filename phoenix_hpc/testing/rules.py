"""The rules of the engine conformance kit, as run on one rank (:mod:`.worker` drives them in lockstep).

Each rule is what the PHOENIX runtime relies on (docs/engines.md, "The contract"):

- ``ordering``: ``forward_backward`` and ``reduce_gradients`` change neither the parameter shard, the
  optimizer shard nor ``step``; ``optimizer_step`` advances ``step`` by exactly 1. ``forward_backward``
  returns a finite float on the last pipeline stage and ``None`` elsewhere.
- ``determinism``: two runs of the same steps from a fresh engine give the same state hash.
- ``shard_names``: shard names are ``opt/pp{pp}/tp{tp}/dp{dp}/{param}/{main|exp_avg|exp_avg_sq}`` (fp32,
  1-D) and ``param/pp{pp}/tp{tp}/{param}``, unique; coverage across DP ranks is checked by the parent
  (:func:`phoenix_hpc.testing.harness.check_coverage`).
- ``save_restore``: a fresh engine loaded with a saved param shard, optimizer shard and envelope (the
  envelope through a JSON round trip) continues bitwise like the engine that was saved; loading an optimizer
  shard with names missing raises :class:`~phoenix_hpc.errors.EngineError`.
- ``recovery_style``: ``recovery_style`` is one of :data:`~phoenix_hpc.engines.base.RECOVERY_STYLES` and
  among ``supported_recovery_styles``.
- ``rebind`` (engines that support it): after ``release_groups`` and ``rebind`` to the groups of a new
  generation, the shard names are unchanged and training continues bitwise as without the rebind.
- ``rebuild`` (engines that support it): ``teardown`` (twice: idempotent), a new engine constructed in
  the new generation and loaded from the saved state continues bitwise.
"""

from __future__ import annotations

import json
import math
import re

import torch

from phoenix_hpc.engines.base import RECOVERY_STYLES, Engine
from phoenix_hpc.engines.base import tensors_digest as digest

#: The rules in run order, each with what must hold (one pytest test each: :mod:`.pytest_kit`).
RULE_TABLE: dict[str, str] = {
    "ordering": "forward_backward / reduce_gradients change no state; optimizer_step advances step by 1",
    "determinism": "two runs from a fresh engine give the same state hash",
    "shard_names": "shard names carry the rank's coordinate; DP ranks' optimizer shards cover every parameter once",
    "save_restore": "a fresh engine loaded with saved shards and envelope continues bitwise",
    "recovery_style": "recovery_style / supported_recovery_styles are consistent",
    "rebind": "rebind to a new generation keeps shard names and continues bitwise",
    "rebuild": "teardown + a new engine loaded from saved state continues bitwise",
}
RULES = tuple(RULE_TABLE)
_KINDS = ("main", "exp_avg", "exp_avg_sq")


def run_steps(engine: Engine, n: int) -> None:
    """``n`` steps in the runtime's order: forward_backward, reduce_gradients, optimizer_step."""
    for _ in range(n):
        engine.forward_backward()
        engine.reduce_gradients()
        engine.optimizer_step()


def check_ordering(engine: Engine, is_last_stage: bool, steps: int = 2) -> list[str]:
    """The ``ordering`` rule on a fresh engine over ``steps`` steps; the violations found."""
    out: list[str] = []
    for _ in range(steps):
        p0, o0, s0 = digest(engine.param_shard()), digest(engine.optimizer_shard()), engine.step
        loss = engine.forward_backward()
        if is_last_stage and not (isinstance(loss, float) and math.isfinite(loss)):
            out.append(f"forward_backward on the last pipeline stage must return the step's loss as a finite "
                       f"float, returned {loss!r}")
        if not is_last_stage and loss is not None:
            out.append(f"forward_backward on a stage other than the last must return None, returned {loss!r}")
        for phase in ("forward_backward", "reduce_gradients"):
            if phase == "reduce_gradients":
                engine.reduce_gradients()
            if digest(engine.param_shard()) != p0:
                out.append(f"parameters changed inside {phase} of step {s0 + 1}: parameters may change only inside "
                           "optimizer_step (the runtime snapshots S(k-1) while forward_backward runs)")
            if digest(engine.optimizer_shard()) != o0:
                out.append(f"the optimizer shard changed inside {phase} of step {s0 + 1}: it may change only inside "
                           "optimizer_step")
            if engine.step != s0:
                out.append(f"step changed inside {phase} (from {s0} to {engine.step}): only optimizer_step advances it")
        engine.optimizer_step()
        if engine.step != s0 + 1:
            out.append(f"optimizer_step must advance step by 1: from {s0} to {engine.step}")
        if out:
            break
    return out


_OPT = re.compile(r"^opt/pp(\d+)/tp(\d+)/dp(\d+)/(.+)/(main|exp_avg|exp_avg_sq)$")
_PARAM = re.compile(r"^param/pp(\d+)/tp(\d+)/(.+)$")


def shard_layout(engine: Engine) -> tuple[list[str], dict]:
    """The ``shard_names`` rule on this rank; ``(violations, layout)`` where ``layout`` is what the parent
    needs for coverage: ``{"params": {name: numel}, "opt": {param: {kind: numel}}}``."""
    out: list[str] = []
    c = engine.coord
    params: dict[str, int] = {}
    for name, t in engine.param_shard():
        m = _PARAM.match(name)
        if not m or (int(m[1]), int(m[2])) != (c.pp, c.tp):
            out.append(f"param shard name {name!r} is not param/pp{c.pp}/tp{c.tp}/<param> (this rank's coordinate)")
            continue
        if m[3] in params:
            out.append(f"param shard name {name!r} appears twice")
        params[m[3]] = t.numel()
    opt: dict[str, dict[str, int]] = {}
    for name, t in engine.optimizer_shard():
        m = _OPT.match(name)
        if not m or (int(m[1]), int(m[2]), int(m[3])) != (c.pp, c.tp, c.dp):
            out.append(f"optimizer shard name {name!r} is not opt/pp{c.pp}/tp{c.tp}/dp{c.dp}/<param>/"
                       "{main|exp_avg|exp_avg_sq} (this rank's coordinate)")
            continue
        if t.dtype != torch.float32 or t.dim() != 1:
            out.append(f"optimizer shard tensor {name!r} is {t.dtype} with {t.dim()} dims, expected fp32 1-D")
        kinds = opt.setdefault(m[4], {})
        if m[5] in kinds:
            out.append(f"optimizer shard name {name!r} appears twice")
        kinds[m[5]] = t.numel()
    for p, kinds in opt.items():
        if set(kinds) != set(_KINDS) or len(set(kinds.values())) != 1:
            out.append(f"optimizer shard of parameter {p!r} must have main, exp_avg and exp_avg_sq of one size, "
                       f"has {kinds}")
        if p not in params:
            out.append(f"optimizer shard names parameter {p!r}, which the param shard does not have")
    return out, {"params": params, "opt": {p: k.get("main", 0) for p, k in opt.items()}}


def save_state(engine: Engine) -> dict:
    """Copies of the param shard, the optimizer shard and the envelope (through JSON, as the runtime
    stores it)."""
    return {
        "param": {n: t.detach().clone() for n, t in engine.param_shard()},
        "opt": {n: t.detach().clone() for n, t in engine.optimizer_shard()},
        "envelope": json.loads(json.dumps(engine.envelope())),
        "step": engine.step,
    }


def load_state(engine: Engine, state: dict) -> None:
    """Load what :func:`save_state` saved, in the runtime's order (params, optimizer shard, envelope)."""
    engine.load_param_shard(state["param"])
    engine.load_optimizer_shard(state["opt"])
    engine.load_envelope(state["envelope"])


def check_recovery_style(cls: type) -> list[str]:
    """The ``recovery_style`` rule on the engine class."""
    out = []
    sup = tuple(getattr(cls, "supported_recovery_styles", ()))
    style = getattr(cls, "recovery_style", None)
    if style not in RECOVERY_STYLES:
        out.append(f"recovery_style {style!r} is not one of {list(RECOVERY_STYLES)}")
    if not sup or any(s not in RECOVERY_STYLES for s in sup):
        out.append(f"supported_recovery_styles {list(sup)} must be a non-empty subset of {list(RECOVERY_STYLES)}")
    if style not in sup:
        out.append(f"recovery_style {style!r} must be among supported_recovery_styles {list(sup)}")
    return out
