"""``phoenix model``: cost model, replica-loss risk, Monte Carlo campaigns and recovery-time scaling fit.

Thin layer: parse options, call :mod:`phoenix_hpc.model`, render a rich table (or JSON with ``--json``) and
optionally a PNG (``--plot FILE.png``). Option names match the library's parameter names, so a
:class:`phoenix_hpc.errors.ModelError` message names the option. Exit codes: 0 success, 2 bad input (the
message names the option, the value and what is allowed).

JSON output is strict JSON: infinities and NaNs are written as ``null``.
"""

from __future__ import annotations

import json
import math

import click

from phoenix_hpc.errors import ModelError
from phoenix_hpc.model.measured_overhead import HARDWARE

#: ``--hardware`` of ``efficiency`` and ``simulate``: the kinds of :data:`HARDWARE`, the first the default.
_hardware_option = click.option(
    "--hardware", type=click.Choice(HARDWARE), default=HARDWARE[0], show_default=True,
    help="The hardware modelled: without --overhead-ratio only a ratio measured on this kind is charged "
         "(BENCHMARKS.json; its source is printed), else none, and the measured ratios are listed.")


def _clean(x):
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


def _emit_json(obj: dict) -> None:
    click.echo(json.dumps(_clean(obj), indent=2, allow_nan=False))


def _console():
    from phoenix_hpc.cli.output import make_console

    return make_console()


def _table(title: str, *columns: str):
    from rich.table import Table

    t = Table(title=title)
    for i, c in enumerate(columns):
        t.add_column(c, justify="left" if i == 0 else "right", no_wrap=i == 0)
    return t


def _g(x: float, digits: int = 4) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    return f"{x:.{digits}g}"


@click.group("model")
def model() -> None:
    """Numbers to choose k, spares and checkpoint interval: cost per fault, efficiency, loss risk.

    Formulas: PHOENIX paper Eqs. (1)-(6); see phoenix_hpc.model.analytic.
    """


@model.command("efficiency")
@click.option("--mttf-s", type=float, required=True, help="System mean time to failure MTTF_sys, seconds.")
@click.option("--step-s", type=float, required=True, help="Time of one training step t_step, seconds.")
@click.option("--ckpt-every", type=int, required=True, help="Checkpoint interval K, steps (>= 1).")
@click.option("--restart-s", type=float, default=None,
              help="Checkpoint-restart E[T_restart], seconds (default: the first --baseline's).")
@click.option("--baseline", "baselines", multiple=True, metavar="NAME=SECONDS",
              help="A restart baseline's measured E[T_restart] (seconds, without replay; BENCHMARKS.md section 2), "
                   "evaluated like checkpoint-restart; NAME one of requeue, in-job, in-process; repeatable.")
@click.option("--ckpt-overhead-s", type=float, default=0.0, show_default=True,
              help="Checkpoint overhead per fault C_overhead^ckpt (Eq. 2), seconds.")
@click.option("--hotswap-s", type=float, required=True, help="PHOENIX hot-swap time E[T_hotswap], seconds.")
@click.option("--phi", type=float, default=0.5, show_default=True,
              help="E[phi]: completed fraction of the interrupted step, in [0, 1).")
@click.option("--phoenix-overhead-s", type=float, default=0.0, show_default=True,
              help="PHOENIX overhead per fault C_overhead^PHOENIX (Eq. 5), seconds; the paper measures ~0.")
@click.option("--overhead-ratio", type=float, default=None,
              help="PHOENIX's per-step overhead ratio r (step time protected / unprotected, a number >= 1), charged "
                   "as (r - 1) x MTTF per fault; default: a ratio measured on the --hardware modelled "
                   "(BENCHMARKS.json), 1 where none was.")
@_hardware_option
@click.option("--protect-every", type=int, default=1, show_default=True,
              help="PHOENIX's protection interval m, from 1 to --ckpt-every (resilience.protect_every_max, phoenix "
                   "status): a fault then loses 3(m-1)/2 more steps on average (at most 2m-1 in all).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.option("--plot", "plot_path", type=str, default=None,
              help="Also write eta against MTTF to FILE.png, every scheme, with the crossovers.")
def efficiency_cmd(mttf_s, step_s, ckpt_every, restart_s, baselines, ckpt_overhead_s, hotswap_s, phi,
                   phoenix_overhead_s, overhead_ratio, hardware, protect_every, as_json, plot_path):
    """Disruption per fault and efficiency of checkpoint-restart and PHOENIX (Eqs. 1-5).

    C_ckpt = C_overhead + restart + t_step (K-1)/2; C_PHOENIX = C_overhead^PHOENIX + (r-1) MTTF + hot swap +
    t_step (phi + 3(m-1)/2); eta = MTTF / (MTTF + C). With r > 1 checkpoint-restart wins above the crossover
    MTTF, printed per checkpoint scheme.
    """
    from phoenix_hpc.model import analytic, plots

    named = parse_baseline_times(baselines)
    explicit = restart_s is not None
    if restart_s is None:
        if not named:
            raise ModelError("--restart-s: missing; give --restart-s or at least one --baseline NAME=SECONDS")
        restart_s = next(iter(named.values()))
    if plot_path:
        plots.check_target(plot_path)
    overhead_ratio, ratio_source, unused = default_overhead_ratio(overhead_ratio, hardware)
    common = dict(step_s=step_s, ckpt_every=ckpt_every, ckpt_overhead_s=ckpt_overhead_s,
                  hotswap_s=hotswap_s, phi=phi, phoenix_overhead_s=phoenix_overhead_s,
                  overhead_ratio=overhead_ratio, protect_every=protect_every)
    rep = analytic.compare_schemes(mttf_s=mttf_s, restart_s=restart_s, **common)
    out = rep.to_dict()
    out["inputs"] = dict(mttf_s=mttf_s, restart_s=restart_s, hardware=hardware, overhead_ratio_source=ratio_source,
                         measured_overhead_ratios_not_charged=[m.to_dict() for m in unused], **common)
    extra = {name: analytic.compare_schemes(mttf_s=mttf_s, restart_s=sec, **common) for name, sec in named.items()}
    if named:
        out["inputs"]["baselines"] = dict(named)
        out["baselines"] = {n: {**b.checkpoint_restart.to_dict(), "disruption_ratio": b.disruption_ratio,
                                "crossover_mttf_s": b.crossover_mttf_s} for n, b in extra.items()}
    # the checkpoint schemes compared: ckpt-restart (--restart-s) and every --baseline, each with its own report
    schemes = ([("ckpt-restart", restart_s, rep)] if explicit else []) + [(n, named[n], b) for n, b in extra.items()]
    if plot_path:  # every curve is Eq. 4 at each MTTF of the axis (PHOENIX's tax grows with the MTTF)
        curves = [(f"{n} (C = {b.checkpoint_restart.disruption_s:.0f} s)",
                   lambda m, sec=sec: analytic.compare_schemes(mttf_s=m, restart_s=sec, **common)
                   .checkpoint_restart.efficiency) for n, sec, b in schemes]
        curves.append((f"PHOENIX (r = {overhead_ratio:.4g}, m = {protect_every})",
                       lambda m: analytic.compare_schemes(mttf_s=m, restart_s=restart_s, **common).phoenix.efficiency))
        marks = [(f"crossover with {n}", b.crossover_mttf_s, i) for i, (n, _, b) in enumerate(schemes)
                 if 0 < b.crossover_mttf_s < math.inf]
        out["plot"] = str(plots.efficiency_vs_mttf(plot_path, mttf_s, curves, marks))
    if as_json:
        _emit_json(out)
        return
    t = _table(f"Disruption per fault at MTTF {mttf_s:g} s (lambda = {rep.failure_rate_per_s:.3g}/s)",
               "scheme", "overhead s", "recovery s", "replay s", "C per fault s", "eta")
    rows = [(f"{n} Eq.2", b.checkpoint_restart) for n, _, b in schemes] + [("PHOENIX Eq.5", rep.phoenix)]
    for name, sc in rows:
        t.add_row(name, _g(sc.overhead_s), _g(sc.recovery_s), _g(sc.replay_s), _g(sc.disruption_s),
                  f"{sc.efficiency:.3f}")
    con = _console()
    con.print(t)
    con.print(f"E[R] = (K-1)/2 = {rep.expected_replay_steps:g} steps; "
              + "; ".join(f"C_{n} / C_PHOENIX = {_g(b.disruption_ratio)}" for n, _, b in schemes))
    con.print(f"PHOENIX per-step overhead ratio {overhead_ratio:.4g} ({ratio_source}), charged "
              f"{_g(rep.phoenix.overhead_s)} s per fault; protection every {protect_every} step(s)"
              + (f": a fault loses at most {2 * protect_every - 1} steps" if protect_every > 1 else ""))
    _print_not_charged(con, unused, hardware)
    for n, _, b in schemes:
        x = b.crossover_mttf_s
        con.print(f"crossover with {n}: " + (
            "PHOENIX is more efficient at every MTTF" if x == math.inf else
            f"{n} is more efficient at every MTTF" if x == 0 else
            f"above an MTTF of {_g(x)} s {n} is more efficient (the per-step tax outweighs the cheaper recoveries)"))
    if plot_path:
        con.print(f"plot written to {out['plot']}")


def _print_not_charged(con, unused: list, hardware: str) -> None:
    """The measured overhead ratios not charged (with what they ran on), so that --overhead-ratio is a
    choice made knowingly."""
    if unused:
        con.print(f"measured overhead ratios not charged (modelling {hardware}; --hardware, --overhead-ratio):")
        for m in unused:
            con.print(f"  - {m.describe()}")


def default_overhead_ratio(given: float | None, hardware: str, path=None) -> tuple[float, str, list]:
    """The per-step overhead ratio to charge, where it came from and the measured ratios not charged
    (:class:`~phoenix_hpc.model.measured_overhead.MeasuredRatio`): ``given`` (``--overhead-ratio``) as it is
    (nothing read), else :func:`phoenix_hpc.model.measured_overhead.choose` over the ratios measured in
    ``BENCHMARKS.json`` at the repository root (or ``path``) for ``hardware``: a ratio measured on that kind of
    hardware, or 1.

    Raises:
        ModelError: the file is not JSON, or its ``overhead_ratio`` is not a number > 0 (the message names the
            file and asks for ``--overhead-ratio``); not read when ``given`` is not None."""
    from pathlib import Path

    from phoenix_hpc.model import measured_overhead as mo

    if given is not None:
        return given, "given (--overhead-ratio)", []
    p = Path(path) if path is not None else Path(__file__).resolve().parents[2] / "BENCHMARKS.json"
    measured = mo.read_measured(p)
    return (*mo.choose(measured, hardware), mo.not_charged(measured, hardware))


def parse_baseline_times(items) -> dict[str, float]:
    """``("in-job=12.5", ...)`` -> ``{"in-job": 12.5}`` (pure). Raises ModelError naming the option, the value
    and the allowed names / values: an unknown name, a value that is not a number >= 0, a name twice."""
    from phoenix_hpc.bench.baselines import BASELINES

    out: dict[str, float] = {}
    for it in items:
        name, sep, val = str(it).partition("=")
        if not sep or name not in BASELINES:
            raise ModelError(f"--baseline: {it!r} is not allowed; NAME=SECONDS with NAME one of {list(BASELINES)}")
        try:
            sec = float(val)
        except ValueError:
            sec = float("nan")
        if not math.isfinite(sec) or sec < 0:
            raise ModelError(f"--baseline: {it!r}: SECONDS must be a number >= 0")
        if name in out:
            raise ModelError(f"--baseline: {name!r} given twice")
        out[name] = sec
    return out


@model.command("loss-risk")
@click.option("--shards", type=int, required=True, help="Number D of optimizer shards (DP shards) at risk.")
@click.option("--p-fail", type=float, default=None,
              help="Per-node, per-step failure probability p (independent failures).")
@click.option("--k", "k", type=int, default=1, show_default=True, help="Replication factor k (replicas per shard).")
@click.option("--steps", type=int, required=True, help="Steps in the run, to accumulate the per-step bound.")
@click.option("--q-domain-fail", type=float, default=None,
              help="Per-domain, per-step failure probability q (domain-aware placement, correlated failures).")
@click.option("--interruption-interval-s", type=float, default=None,
              help="Derive p instead: mean time between system interruptions, seconds (with --nodes, --step-s).")
@click.option("--nodes", type=int, default=None, help="Node count, to derive p.")
@click.option("--step-s", type=float, default=None, help="Step time in seconds, to derive p.")
@click.option("--k-max", type=int, default=None, help="Largest k in the table and plot [default: max(k, 3)].")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.option("--plot", "plot_path", type=str, default=None, help="Also write risk against k to FILE.png.")
def loss_risk_cmd(shards, p_fail, k, steps, q_domain_fail, interruption_interval_s, nodes, step_s, k_max, as_json,
                  plot_path):
    """Bound on losing a shard and all its replicas: D p^(k+1) per step (Eq. 6), accumulated over the run.

    "Over the run" is the union bound steps x per-step (as published); the value for independent steps,
    1 - (1 - P)^steps, is given beside it.
    """
    from phoenix_hpc.model import analytic, plots
    from phoenix_hpc.model import validate as v

    if plot_path:
        plots.check_target(plot_path)
    derive = [x is not None for x in (interruption_interval_s, nodes, step_s)]
    p_source = "given"
    if any(derive):
        if p_fail is not None:
            raise ModelError("--p-fail: give either --p-fail or --interruption-interval-s with --nodes and "
                             "--step-s, not both")
        if not all(derive):
            raise ModelError("--interruption-interval-s, --nodes and --step-s: all three are needed to derive "
                             "--p-fail")
        p_fail = analytic.per_step_failure_prob(interruption_interval_s, nodes, step_s)
        p_source = "derived: 1 - exp(-step_s / (interruption_interval_s * nodes))"
    if p_fail is None and q_domain_fail is None:
        raise ModelError("--p-fail: missing; give --p-fail, --q-domain-fail, or --interruption-interval-s with "
                         "--nodes and --step-s")
    kk = v.integer_at_least("k", k, 0)
    k_max = max(kk, 3) if k_max is None else v.integer_at_least("k_max", k_max, kk)
    out: dict = {"shards": shards, "k": kk, "steps": steps}
    plot_rows = []
    models = []
    if p_fail is not None:
        models.append(("independent", "p_fail", p_fail, "D * p^(k+1) (Eq. 6)", p_source))
    if q_domain_fail is not None:
        v.probability("q_domain_fail", q_domain_fail)
        models.append(("domain_aware", "q_domain_fail", q_domain_fail,
                       "D * q^(k+1) (Eq. 6 with q, k+1 distinct failure domains)", "given"))
    for key, name, prob, formula, source in models:
        risks = [analytic.loss_risk(shards, prob, j, steps) for j in range(k_max + 1)]
        here = risks[kk]
        out[key] = {name: prob, "source": source, "formula": formula, **here.to_dict(),
                    "by_k": [r.to_dict() for r in risks]}
        plot_rows.append((f"{key} ({name} = {prob:.3g})", list(range(k_max + 1)),
                          [r.over_run_union_bound for r in risks]))
    if plot_path:
        out["plot"] = str(plots.loss_risk_vs_k(plot_path, plot_rows, steps))
    if as_json:
        _emit_json(out)
        return
    con = _console()
    for key, name, prob, formula, source in models:
        t = _table(f"{key}: {formula}, D = {shards}, {name} = {prob:.3g} ({source})",
                   "k", "per step", f"over {steps} steps (union bound)", "over run (independent steps)")
        for r in out[key]["by_k"]:
            mark = " <" if r["k"] == kk else ""
            t.add_row(f"{r['k']}{mark}", _g(r["per_step"], 3), _g(r["over_run_union_bound"], 3),
                      _g(r["over_run_independent_steps"], 3))
        con.print(t)
    if plot_path:
        con.print(f"plot written to {out['plot']}")


@model.command("simulate")
@click.option("--mttf-s", type=float, required=True, help="System MTTF (mean time between faults), seconds.")
@click.option("--step-s", type=float, required=True, help="Step time, seconds.")
@click.option("--steps", type=int, required=True, help="Steps in the training campaign.")
@click.option("--ckpt-every", type=int, required=True, help="Checkpoint interval K, steps.")
@click.option("--restart-s", type=str, required=True,
              help="Checkpoint-restart time per fault: 600, const:600, normal:M,SD, lognormal:M,SD, "
                   "uniform:LO,HI, exp:M (seconds).")
@click.option("--hotswap-s", type=str, default=None, help="PHOENIX hot-swap time per fault, same forms.")
@click.option("--hotswap-journal", type=str, multiple=True,
              help="Instead of --hotswap-s: resample total_s of recovery_done records of these run directories "
                   "or journal.jsonl files (repeatable). total_s includes the measured run's replay, which the "
                   "simulation adds again (at most one step), so PHOENIX's loss is slightly overstated.")
@click.option("--ckpt-overhead-s", type=float, default=0.0, show_default=True,
              help="Checkpoint overhead charged per fault (Eq. 2), seconds.")
@click.option("--ckpt-write-s", type=float, default=0.0, show_default=True,
              help="Wall time of each checkpoint write (every K steps), seconds.")
@click.option("--phoenix-overhead-s", type=float, default=0.0, show_default=True,
              help="PHOENIX overhead charged per fault (Eq. 5), seconds.")
@click.option("--arrivals", type=str, default="poisson", show_default=True,
              help="Fault arrivals: poisson, or weibull:SHAPE (bursty for SHAPE < 1), same mean MTTF.")
@click.option("--fault-clock", type=str, default="wall", show_default=True,
              help="wall: faults also strike during restarts and replay; progress: only during new progress "
                   "(the assumption of Eq. 4).")
@click.option("--trials", type=int, default=1000, show_default=True, help="Number of simulated campaigns.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the random generators.")
@click.option("--max-faults", type=int, default=100_000, show_default=True,
              help="Stop a trial after this many faults (it is then reported as unfinished).")
@click.option("--spares", type=int, default=None,
              help="PHOENIX spare nodes; the (S+1)-th fault shrinks the job (needs --dp) [default: unlimited].")
@click.option("--dp", type=int, default=None, help="Data-parallel size at the start (with --spares).")
@click.option("--tp", type=int, default=1, show_default=True, help="Tensor-parallel size (what a shrink frees).")
@click.option("--pp", type=int, default=1, show_default=True, help="Pipeline-parallel size (what a shrink frees).")
@click.option("--gpus-per-node", type=int, default=1, show_default=True,
              help="Rank slots per node (what a shrink frees).")
@click.option("--shrink-s", type=str, default=None,
              help="Downtime of a shrink, same forms as --hotswap-s [default: the hot-swap law].")
@click.option("--overhead-ratio", type=float, default=None,
              help="PHOENIX's per-step overhead ratio (a number >= 1): its steps (and replays) take this many times "
                   "longer; default: a ratio measured on the --hardware modelled (BENCHMARKS.json), 1 where none was.")
@_hardware_option
@click.option("--protect-every", type=int, default=1, show_default=True,
              help="PHOENIX's protection interval m, from 1 to --ckpt-every, for the whole campaign "
                   "(resilience.protect_every_max's worst case): a fault rolls back to the newest committed "
                   "snapshot, 3(m-1)/2 more steps on average.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.option("--plot", "plot_path", type=str, default=None, help="Also write a lost-time histogram to FILE.png.")
def simulate_cmd(mttf_s, step_s, steps, ckpt_every, restart_s, hotswap_s, hotswap_journal, ckpt_overhead_s,
                 ckpt_write_s, phoenix_overhead_s, arrivals, fault_clock, trials, seed, max_faults, spares, dp, tp,
                 pp, gpus_per_node, shrink_s, overhead_ratio, hardware, protect_every, as_json,
                 plot_path):
    """Monte Carlo over whole campaigns: mean and 95 % CI of lost time, eta, and the ckpt/PHOENIX ratio.

    With --spares S and --dp D, the (S+1)-th fault shrinks the job instead of being hot-swapped: dp drops by
    the replica(s) of the dead node, their healthy nodes become spares, and training goes on at (dp-1)/dp of
    the throughput (phoenix_hpc.model.spares); with no replica left the job stops and restarts from its
    checkpoint.
    """
    from phoenix_hpc.model import analytic, dist, journal, montecarlo, plots
    from phoenix_hpc.model import spares as spm
    from phoenix_hpc.model import validate as v

    if plot_path:
        plots.check_target(plot_path)
    restart = dist.parse_dist("restart_s", restart_s)
    if hotswap_journal and hotswap_s is not None:
        raise ModelError("--hotswap-s: give either --hotswap-s or --hotswap-journal, not both")
    if hotswap_journal:
        samples = [x for j in hotswap_journal for x in journal.read_recoveries(j, option="--hotswap-journal")]
        hotswap = dist.empirical(samples, ", ".join(hotswap_journal))
    elif hotswap_s is not None:
        hotswap = dist.parse_dist("hotswap_s", hotswap_s)
    else:
        raise ModelError("--hotswap-s: missing; give --hotswap-s or --hotswap-journal")
    elastic: dict = {}
    if spares is None and (dp is not None or shrink_s is not None):
        raise ModelError("--spares: missing; --dp and --shrink-s only apply with --spares")
    if spares is not None:
        if dp is None:
            raise ModelError("--dp: missing; --spares needs the data-parallel size (a shrink costs 1/dp)")
        elastic = {"spares": v.integer_at_least("spares", spares, 0),
                   "dp": v.integer_at_least("dp", dp, 1),
                   "shape": spm.shrink_shape(tp, pp, dp, gpus_per_node),
                   "shrink": None if shrink_s is None else dist.parse_dist("shrink_s", shrink_s)}
    overhead_ratio, ratio_source, unused = default_overhead_ratio(overhead_ratio, hardware)
    camp = montecarlo.Campaign(
        mttf_s=mttf_s, step_s=step_s, steps=steps, ckpt_every=ckpt_every, restart=restart, hotswap=hotswap,
        ckpt_overhead_s=ckpt_overhead_s, phoenix_overhead_s=phoenix_overhead_s, ckpt_write_s=ckpt_write_s,
        phoenix_overhead_ratio=overhead_ratio, protect_every=protect_every, arrivals=montecarlo.parse_arrivals(arrivals), fault_clock=fault_clock, trials=trials, seed=seed,
        max_faults=max_faults, **elastic)
    ck, px = montecarlo.run_trials(camp)
    res = montecarlo.summarise(camp, ck, px)
    ref = analytic.compare_schemes(mttf_s=mttf_s, step_s=step_s, ckpt_every=ckpt_every, restart_s=restart.mean_s,
                                   ckpt_overhead_s=ckpt_overhead_s, hotswap_s=hotswap.mean_s, phi=0.5,
                                   phoenix_overhead_s=phoenix_overhead_s, overhead_ratio=overhead_ratio,
                                   protect_every=protect_every)
    out = res.to_dict()
    out["inputs"] = {"restart_s": restart.label, "hotswap_s": hotswap.label, "ckpt_every": ckpt_every,
                     "mttf_s": mttf_s, "step_s": step_s, "steps": steps, "ckpt_overhead_s": ckpt_overhead_s,
                     "ckpt_write_s": ckpt_write_s, "phoenix_overhead_s": phoenix_overhead_s,
                     "overhead_ratio": overhead_ratio, "hardware": hardware, "overhead_ratio_source": ratio_source,
                     "measured_overhead_ratios_not_charged": [m.to_dict() for m in unused],
                     "protect_every": protect_every, "spares": spares, "dp": dp,
                     "shrink_shape": elastic["shape"].to_dict() if elastic else None,
                     "shrink_s": (camp.shrink or hotswap).label if elastic else None}
    out["analytic_eq4"] = {"checkpoint_restart_efficiency": ref.checkpoint_restart.efficiency,
                           "phoenix_efficiency": ref.phoenix.efficiency,
                           "checkpoint_restart_disruption_s": ref.checkpoint_restart.disruption_s,
                           "phoenix_disruption_s": ref.phoenix.disruption_s,
                           "crossover_mttf_s": ref.crossover_mttf_s}
    if plot_path:
        out["plot"] = str(plots.lost_time_histogram(plot_path, ck.lost_s, px.lost_s))
    if as_json:
        _emit_json(out)
        return
    con = _console()
    t = _table(f"{trials} campaigns of {steps} steps x {step_s:g} s = {res.campaign_s / 3600:.1f} h of training; "
               f"MTTF {mttf_s:g} s, arrivals {res.arrivals}, fault clock {res.fault_clock}; mean [95 % CI]",
               "per campaign", "checkpoint-restart", "PHOENIX")
    ck_s, px_s = res.checkpoint_restart, res.phoenix

    def ci(e, scale=1.0, fmt=".2f"):
        return f"{e.mean / scale:{fmt}} [{e.low / scale:{fmt}}, {e.high / scale:{fmt}}]"

    t.add_row("lost time, h", ci(ck_s.lost_s, 3600), ci(px_s.lost_s, 3600))
    t.add_row("efficiency eta", ci(ck_s.efficiency, fmt=".4f"), ci(px_s.efficiency, fmt=".4f"))
    t.add_row("faults", ci(ck_s.faults, fmt=".1f"), ci(px_s.faults, fmt=".1f"))
    t.add_row("lost s per fault", _g(ck_s.cost_per_fault_s), _g(px_s.cost_per_fault_s))
    t.add_row("  downtime, h", f"{ck_s.downtime_s / 3600:.2f}", f"{px_s.downtime_s / 3600:.2f}")
    t.add_row("  replayed compute, h", f"{ck_s.replay_s / 3600:.2f}", f"{px_s.replay_s / 3600:.2f}")
    t.add_row("  checkpoint writes, h", f"{ck_s.write_s / 3600:.2f}", "-")
    if elastic:
        t.add_row("  running shrunk, h", "-", f"{px_s.slow_s / 3600:.2f}")
        t.add_row("shrinks", "-", ci(px_s.shrinks, fmt=".2f"))
        t.add_row("stops (no replica left)", "-", f"{px_s.stops:.3f}")
        t.add_row("dp at the end (mean)", "-", f"{px_s.final_dp:.2f} of {dp}")
    t.add_row("eta by Eq. 4 (means)", f"{ref.checkpoint_restart.efficiency:.4f}", f"{ref.phoenix.efficiency:.4f}")
    con.print(t)
    if elastic:
        sh = elastic["shape"]
        con.print(f"PHOENIX with {spares} spare(s): a shrink removes {sh.replicas} DP replica(s) "
                  f"(throughput x {spm.shrink_throughput(dp, sh.replicas):.3f} the first time) and frees "
                  f"{sh.freed_spares} node(s) as spares; Eq. 4 above assumes unlimited spares")
    r = res.lost_ratio
    con.print(f"lost time checkpoint-restart / PHOENIX: {_g(r.mean)} (95 % CI {_g(r.low)} - {_g(r.high)})")
    con.print(f"PHOENIX per-step overhead ratio {overhead_ratio:.4g} ({ratio_source}): its steps and replays run "
              f"that much slower (lost time includes {_g(steps * step_s * (overhead_ratio - 1) / 3600)} h of it); "
              f"protection every {protect_every} step(s)"
              + (f": a fault loses at most {2 * protect_every - 1} steps" if protect_every > 1 else ""))
    _print_not_charged(con, unused, hardware)
    x = ref.crossover_mttf_s
    con.print("crossover (Eq. 4, means): " + (
        "PHOENIX is more efficient at every MTTF" if x == math.inf else
        "checkpoint-restart is more efficient at every MTTF" if x == 0 else
        f"above an MTTF of {_g(x)} s checkpoint-restart is more efficient"))
    for name, s in (("checkpoint-restart", res.checkpoint_restart), ("PHOENIX", res.phoenix)):
        if s.unfinished_trials:
            con.print(f"[yellow]{name}: {s.unfinished_trials} trial(s) hit --max-faults {max_faults}; their lost "
                      "time is a lower bound[/yellow]")
    if plot_path:
        con.print(f"plot written to {out['plot']}")


@model.command("spares")
@click.option("--nodes", type=int, default=None, help="Active nodes N [default: resources.nodes of --config].")
@click.option("--mttf-node-h", type=float, default=None,
              help="Mean time to failure of one node, hours [default: node.mttf_h of the --site profile].")
@click.option("--hours", type=float, default=None, help="Run time T, hours [default: the --config's time limit].")
@click.option("--target", type=float, default=0.99, show_default=True,
              help="Probability that no fault has to shrink the job, strictly between 0 and 1.")
@click.option("--dp", type=int, default=None, help="Data-parallel size: the throughput a shrink costs.")
@click.option("--tp", type=int, default=None, help="Tensor-parallel size (what a shrink frees) [default: 1].")
@click.option("--pp", type=int, default=None, help="Pipeline-parallel size (what a shrink frees) [default: 1].")
@click.option("--gpus-per-node", type=int, default=None, help="Rank slots per node [default: 1].")
@click.option("--spares", type=int, default=None, help="The job's spares: its odds and expected shrinks.")
@click.option("--config", "config", type=str, default=None,
              help="Job config: nodes, hours (time limit), grid and spares default to its values (needs --site).")
@click.option("--site", type=str, default=None, help="Site profile for --config (and node.mttf_h).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def spares_cmd(nodes, mttf_node_h, hours, target, dp, tp, pp, gpus_per_node, spares, config, site, as_json):
    """Spare nodes needed so that no fault shrinks the job with probability --target, and the cost of a shrink.

    Node failures as a Poisson process: X ~ Poisson(N T / MTTF_node); spares needed = the smallest S with
    P(X <= S) >= target. A shrink removes the DP replica of the failed node: throughput (dp-1)/dp.
    """
    from phoenix_hpc.model import spares as spm

    mttf_source = "given"
    if site is not None and config is None and mttf_node_h is None:
        from phoenix_hpc.profiles import load_profile

        prof = load_profile(site)
        mttf_node_h, mttf_source = prof.node.mttf_h, f"site {prof.name} ({prof.node.mttf_source})"
    if config is not None:
        job, prof = _resolve_for_model(config, site)
        nodes = job.nodes if nodes is None else nodes
        hours = job.time_limit_s / 3600 if hours is None else hours
        dp = job.dp if dp is None else dp
        tp = job.tp if tp is None else tp
        pp = job.pp if pp is None else pp
        gpus_per_node = job.gpus_per_node if gpus_per_node is None else gpus_per_node
        spares = job.spares if spares is None else spares
        if mttf_node_h is None:
            mttf_node_h, mttf_source = prof.node.mttf_h, f"site {prof.name} ({prof.node.mttf_source})"
    for name, val in (("nodes", nodes), ("hours", hours)):
        if val is None:
            raise ModelError(f"--{name}: missing; give --{name} or --config CONFIG --site SITE")
    if mttf_node_h is None:
        raise ModelError("--mttf-node-h: missing; give --mttf-node-h, or --site with a profile that sets "
                         "node.mttf_h")
    if spares is not None and dp is None:
        raise ModelError("--dp: missing; --spares needs the data-parallel size (what a shrink costs)")
    shape = None
    if dp is not None:
        shape = spm.shrink_shape(tp or 1, pp or 1, dp, gpus_per_node or 1)
    plan = spm.plan_spares(nodes, mttf_node_h, hours, target, dp=dp, shape=shape, spares=spares)
    out = plan.to_dict()
    out["mttf_source"] = mttf_source
    out["formula"] = "X ~ Poisson(nodes x hours / mttf_node_h); spares_needed = min S with P(X <= S) >= target"
    if as_json:
        _emit_json(out)
        return
    con = _console()
    con.print(f"node failures expected: {plan.expected_failures:.3g} = {nodes} nodes x {hours:g} h / node MTTF "
              f"{mttf_node_h:g} h ({mttf_source}); X ~ Poisson({plan.expected_failures:.3g})")
    t = _table("Spares and the probability that no fault shrinks the job", "spares S", "P(X <= S)", "")
    for s_, pr in plan.by_spares:
        marks = [m for m, on in (("needed", s_ == plan.spares_needed), ("the job's", s_ == spares)) if on]
        t.add_row(str(s_), f"{pr:.4f}", ", ".join(marks))
    con.print(t)
    con.print(f"spares needed for P(no shrink) >= {target:g}: {plan.spares_needed}")
    if plan.dp is not None:
        con.print(f"a shrink removes {plan.shape.replicas} DP replica(s) of dp={plan.dp}: throughput "
                  f"x {plan.throughput_after_shrink:.6g} ({100 * plan.lost_per_shrink:.3g} % lost), and frees "
                  f"{plan.shape.freed_spares} node(s) as spares")
    if plan.spares is not None:
        con.print(f"with the job's {plan.spares} spare(s): P(no shrink) {plan.p_no_shrink:.4f}, expected shrinks "
                  f"{plan.expected_shrinks:.3g}, P(stop: no replica left) {plan.p_stop:.3g}")
        con.print(f"mean throughput over the {hours:g} h: {plan.mean_throughput:.4f} of a run without shrinks "
                  "(recovery downtime not counted; phoenix model simulate --spares counts it)")


def _resolve_for_model(config: str, site: str | None):
    """``(ResolvedJob, SiteProfile)`` of ``config`` on ``site`` for ``phoenix model`` (no files written).

    Raises ModelError without ``--site``; ConfigError for an invalid config."""
    import sys
    from pathlib import Path

    from phoenix_hpc.config.load import load_job_config
    from phoenix_hpc.config.resolve import resolve
    from phoenix_hpc.profiles import load_profile

    if site is None:
        raise ModelError("--site: missing; --config needs the site profile it is resolved against")
    prof = load_profile(site)
    cfg = load_job_config(Path(config))
    return resolve(cfg, prof, run_dir="/", default_python=sys.executable), prof


@model.command("fit")
@click.option("--csv", "csv_path", type=str, default=None, help="CSV with a header and columns gpus,seconds.")
@click.option("--journal", type=str, multiple=True,
              help="Run directory or journal.jsonl of a run (repeatable; pair each with a --gpus).")
@click.option("--gpus", type=int, multiple=True, help="GPU count of the run of the matching --journal.")
@click.option("--phase", type=str, default="total", show_default=True,
              help="Journal time to fit: total (total_s) or a phase: detect, reconfigure, params, optimizer, "
                   "replay.")
@click.option("--target-gpus", type=int, multiple=True, help="Sizes to extrapolate to [default: 10000, 100000].")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.option("--plot", "plot_path", type=str, default=None, help="Also write the fit to FILE.png.")
def fit_cmd(csv_path, journal, gpus, phase, target_gpus, as_json, plot_path):
    """Fit recovery time against GPU count (constant, linear, log, power), rank by AICc, extrapolate."""
    from phoenix_hpc.model import fit, plots
    from phoenix_hpc.model import journal as jr

    if plot_path:
        plots.check_target(plot_path)
    if csv_path and (journal or gpus):
        raise ModelError("--csv: give either --csv or --journal/--gpus pairs, not both")
    if csv_path:
        if phase != "total":
            raise ModelError(f"--phase: {phase!r} is not allowed with --csv (the CSV's seconds are fitted as they "
                             "are); --phase picks a journal's time, with --journal")
        xs, ys = fit.read_csv(csv_path)
    elif journal:
        if len(journal) != len(gpus):
            raise ModelError(f"--gpus: {len(gpus)} value(s) for {len(journal)} --journal(s) is not allowed; give "
                             "one --gpus per --journal, in the same order")
        xs, ys = [], []
        for path, n in zip(journal, gpus):
            vals = jr.read_recoveries(path, phase)
            if not vals:
                raise ModelError(f"--journal: {path!r} is not allowed; it holds no recovery_done record")
            xs += [n] * len(vals)
            ys += vals
    else:
        raise ModelError("--csv: missing; give --csv FILE or --journal DIR --gpus N pairs")
    res = fit.fit_scaling(xs, ys, tuple(target_gpus) or fit.DEFAULT_TARGETS)
    out = res.to_dict()
    if plot_path:
        out["plot"] = str(plots.scaling_fit(plot_path, xs, ys, res))
    if as_json:
        _emit_json(out)
        return
    con = _console()
    t = _table(f"{res.points} measurements at {len(res.sizes)} sizes ({', '.join(map(str, res.sizes))} GPUs), "
               f"ranked by {res.criterion}", "law", "t(n), seconds", "R^2", "RMSE s", f"delta {res.criterion}",
               "weight")
    for lf in res.laws:
        params = ", ".join(f"{k}={_g(x)}" for k, x in lf.params.items())
        t.add_row(lf.law, f"{lf.formula}; {params}", _g(lf.r2, 3), _g(lf.rmse_s, 3), f"{lf.delta:.2f}",
                  f"{lf.weight:.3f}")
    con.print(t)
    tg = [p.gpus for p in res.laws[0].predictions]
    e = _table("Extrapolation, seconds [95 % prediction interval within the law]", "law",
               *[f"{n} GPUs" for n in tg])
    for lf in res.laws:
        e.add_row(lf.law, *[f"{p.seconds:.1f} [{p.low:.1f}, {p.high:.1f}]" for p in lf.predictions])
    con.print(e)
    con.print(f"best: {res.best}; {res.criterion} lower by {res.delta_runner_up:.2f} than {res.runner_up} "
              f"(evidence ratio {_g(res.evidence_ratio, 3)}). Intervals are within one law; the spread between "
              "laws is the model uncertainty.")
    if plot_path:
        con.print(f"plot written to {out['plot']}")



from phoenix_hpc.cli.model_hotswap import hotswap_cmd  # noqa: E402  (its own module; registered here)

model.add_command(hotswap_cmd)
