"""``phoenix model hotswap``: what one node loss costs at N GPUs, part by part, with each number's source.

Thin layer over :mod:`phoenix_hpc.model.hotswap` (the formulas and published figures) and
:mod:`phoenix_hpc.bench.hotswap_inputs` (the scaled job, its sizes and the measured figures); registered on the
``phoenix model`` group. Exit codes: 0 success, 2 bad input (the message names the option, the value and what
is allowed).
"""

from __future__ import annotations

import click

from phoenix_hpc.errors import ModelError


@click.command("hotswap")
@click.option("--site", type=str, required=True, metavar="NAME|PATH",
              help="Site profile, a site's name or a profile file's path (as for phoenix submit): its node "
                   "limits (what it can allocate), GPUs and NICs per node, node.nic_gbps.")
@click.option("--config", "config", type=str, default=None,
              help="Job config to scale [default: examples/NAME-7b.yaml, NAME the site profile's name, where it "
                   "exists].")
@click.option("--step-s", type=float, default=None,
              help="The job's step time, seconds (the config has none: measure it, e.g. from a run's journal); "
                   "the quiesce (one micro-batch of it at most) and the replay (one step) follow it.")
@click.option("--gpus", type=int, multiple=True,
              help="Size to project, GPUs (repeatable) [default: 1024, 4096, 16384, 100000 within the site].")
@click.option("--beyond-site", is_flag=True,
              help="Allow sizes above what the site can allocate: a larger machine of the same nodes and links.")
@click.option("--benchmarks", "benchmarks", type=str, default=None,
              help="Where the measured figures are read: a BENCHMARKS.json, or the control-plane benchmark's own "
                   "JSON (its --json FILE) [default: the repository's BENCHMARKS.json].")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
def hotswap_cmd(site, config, step_s, gpus, beyond_site, benchmarks, as_json):
    """What one node loss costs at N GPUs, part by part, with the source of every number.

    Parts: detection (process exit, measured here; node silent, from the heartbeat timeout), the control
    plane's round: every survivor's quiesce answer, the plan made and pushed (the simulated-rank benchmark),
    the survivors' quiesce (leaving the abandoned step: up to one micro-batch), the
    communicator rebuild (today's, and the shrink-based design of docs/design.md section 13), the state
    transfer (the lost rank's weights and optimizer shard over the site's NICs), the replay (one step).
    Formulas and published figures: phoenix_hpc.model.hotswap.
    """
    from pathlib import Path

    from phoenix_hpc.cli.model import _emit_json, _resolve_for_model
    from phoenix_hpc.model import hotswap as hs
    from phoenix_hpc.bench import hotswap_inputs as hj

    if config is None:
        from phoenix_hpc.profiles import load_profile

        name = load_profile(site).name  # an unknown site is named as such; a path gives its profile's name
        guess = Path(__file__).resolve().parents[2] / "examples" / f"{name}-7b.yaml"
        if Path(name).name != name or name.startswith("."):  # no example is found outside examples/
            raise ModelError(f"--config: missing; site {site!r} is named {name!r}, not a plain file name, so it "
                             "has no example examples/NAME-7b.yaml: give --config JOB.yaml")
        if not guess.is_file():
            raise ModelError(f"--config: missing; site {name!r} has no example examples/{name}-7b.yaml: give "
                             "--config JOB.yaml")
        config = f"examples/{name}-7b.yaml"
        job, prof = _resolve_for_model(str(guess), site)
    else:
        job, prof = _resolve_for_model(config, site)
    cfg = job.config
    if prof.node.nic_gbps is None:
        raise ModelError(f"--site: {site!r} is not allowed here; its profile sets no node.nic_gbps (the line rate "
                         "of one NIC, Gb/s), which the state transfer needs: use a site with a link figure "
                         "(perlmutter, vista) or set node.nic_gbps in the profile")
    if prof.node.nics < 1:
        raise ModelError(f"--site: {site!r} is not allowed here; node.nics is {prof.node.nics}: the state transfer "
                         "needs at least one NIC")
    if cfg.engine not in ("megatron", "torch") or cfg.model.factory is not None or cfg.model.provider is not None:
        raise ModelError(f"--config: {config!r} is not allowed; the projection estimates the lost rank's state "
                         "from the built-in model fields, so the engine must be megatron or torch with no "
                         "model.factory or model.provider")
    if step_s is None:
        raise ModelError("--step-s: missing; give the job's step time in seconds (the config holds none; a run's "
                         "journal has it)")
    hs.replay(step_s)  # refuses a step time that is not > 0 before anything is printed
    tp, pp, gpn, spares = job.tp, job.pp, job.gpus_per_node, job.spares
    step = hj.gpu_step(tp, pp, gpn)
    lowest = hj.min_gpus(tp, pp, gpn, cfg.resilience.k)
    qos = cfg.resources.qos if cfg.resources.qos is not None else prof.scheduler.qos
    part = cfg.resources.partition if cfg.resources.partition is not None else prof.scheduler.partition
    max_nodes, limit_what = hj.site_max_nodes(prof, qos, part)
    highest = hj.max_gpus(max_nodes, spares, tp, pp, gpn)
    skipped: list[int] = []
    if gpus:
        sizes = list(gpus)
        twice = sorted({n for n in sizes if sizes.count(n) > 1})
        if twice:
            raise ModelError(f"--gpus: {twice[0]} is given twice; give each size once")
        for n in sizes:
            hj.check_gpus(n, lowest, highest, step, limit_what, beyond_site)
    else:
        sizes = [n for n in hj.DEFAULT_GPUS if beyond_site or highest is None or n <= highest]
        skipped = [n for n in hj.DEFAULT_GPUS if n not in sizes]
        if highest is not None and highest < lowest and not beyond_site:
            raise ModelError(f"--gpus: not given, and none can be; {hj.no_size_fits(lowest, highest, limit_what)}")
        if not sizes:
            raise ModelError(f"--gpus: none of the default sizes {list(hj.DEFAULT_GPUS)} fits {limit_what} (at most "
                             f"{highest} GPUs for this job); give --gpus from {lowest} to {highest}, or "
                             "--beyond-site")
    if benchmarks is not None and not Path(benchmarks).is_file():  # a record asked for must be read
        what = "a directory, not a file" if Path(benchmarks).is_dir() else "no such file"
        raise ModelError(f"--benchmarks: {benchmarks!r} is not allowed; {what}: give a BENCHMARKS.json or "
                         "the control-plane benchmark's JSON")
    measured = hj.Measured.of(*hj.read_record(Path(benchmarks) if benchmarks else hj.DEFAULT_RECORD))
    results = [hj.project(job, prof.node, n, step_s, measured, highest) for n in sizes]
    out = {"site": prof.name, "config": config, "step_s": step_s, "grid": {"tp": tp, "pp": pp, "gpus_per_node": gpn},
           "site_limit": {"max_gpus": highest, "by": limit_what}, "smallest_gpus": lowest, "gpu_step": step,
           "skipped_default_sizes": skipped, "record": measured.record, "projections": results,
           "anchors": list(hs.ANCHORS)}
    if as_json:
        _emit_json(out)
        return
    _print_hotswap(out)


#: Row labels of ``phoenix model hotswap``'s table, in order.
_HOTSWAP_ROWS = (("detection_exit", "detection: process exit"), ("detection_heartbeat", "detection: node silent"),
                 ("plan_push", "quiesce round, plan, push"), ("quiesce", "quiesce (leave the step)"),
                 ("rebuild_today", "rebuild: today"), ("rebuild_today_lazy", "rebuild: today, lazy init"),
                 ("rebuild_shrink", "rebuild: shrink + split"), ("transfer", "state transfer"),
                 ("replay", "replay (one step)"))


def _span(e: dict) -> str:
    from phoenix_hpc.cli.model import _g

    if e.get("seconds") is None:
        return "missing"
    if abs(e["high"] - e["low"]) < 1e-12:
        return _g(e["seconds"], 3)
    return f"{_g(e['seconds'], 3)} [{_g(e['low'], 3)}, {_g(e['high'], 3)}]"


def _print_hotswap(out: dict) -> None:
    from rich.markup import escape

    from phoenix_hpc.cli.model import _console, _g, _table

    con = _console()
    res = out["projections"]
    lim = out["site_limit"]
    con.print(f"site {out['site']}, {out['config']}: tp {out['grid']['tp']} x pp {out['grid']['pp']}, "
              f"{out['grid']['gpus_per_node']} GPU(s) per node, step {out['step_s']:g} s; scaled by dp (batch per "
              f"replica kept); sizes from {out['smallest_gpus']} in steps of {out['gpu_step']}; the site allocates "
              f"at most {lim['max_gpus'] if lim['max_gpus'] is not None else 'any number of'} GPUs ({lim['by']})")
    if out["skipped_default_sizes"]:
        con.print(f"[yellow]not projected: {', '.join(f'{n:,}' for n in out['skipped_default_sizes'])} GPUs, beyond "
                  "what the site allocates (--beyond-site projects a larger machine of its nodes and links)[/yellow]")
    t = _table(escape("A hot swap by part, seconds: value [low, high]"), "part",
               *[f"{r['gpus']:,} GPUs" + (" (beyond site)" if r["beyond_site"] else "") for r in res])
    for key, label in _HOTSWAP_ROWS:
        t.add_row(label, *[_span(r["parts"][key]) for r in res])
    for name, label in (("today", "today"), ("today_lazy", "today, lazy init"), ("shrink", "shrink + split")):
        for path, plabel in (("exit", "process exit"), ("heartbeat", "node silent")):
            cells = []
            for r in res:
                tt = r["totals"][name][path]
                cells.append(f"{_g(tt['seconds'], 3)} [{_g(tt['low'], 3)}, {_g(tt['high'], 3)}]"
                             + (" *" if tt["left_out"] else ""))
            t.add_row(f"total, {label}, {plabel}", *cells)
    con.print(t)
    left = sorted({p for r in res for tot in r["totals"].values() for x in tot.values() for p in x["left_out"]})
    if left:
        con.print(f"[yellow]* the totals leave out: {', '.join(left)} (no measured figure; see the sources)[/yellow]")
    s = _table("Where each number comes from", "part", "origin", "source")
    for key, label in _HOTSWAP_ROWS:
        origins = {}
        for r in res:
            origins.setdefault(r["parts"][key]["origin"], []).append(f"{r['gpus']:,}")
        sources = {}
        for r in res:
            sources.setdefault(r["parts"][key]["source"], []).append(f"{r['gpus']:,}")
        origin = "; ".join(o if len(origins) == 1 else f"{o} ({', '.join(ns)})" for o, ns in origins.items())
        source = "; ".join(x if len(sources) == 1 else f"{', '.join(ns)} GPUs: {x}" for x, ns in sources.items())
        s.add_row(label, escape(origin), escape(source))
    con.print(s)
    a = _table("Anchors: published hot swaps and restarts", "system", "what", "GPUs", "seconds", "source")
    for x in out["anchors"]:
        a.add_row(*(escape(x[k]) for k in ("system", "what", "gpus", "seconds", "source")))
    con.print(a)
    con.print(escape(f"measured figures from {out['record']}"))
