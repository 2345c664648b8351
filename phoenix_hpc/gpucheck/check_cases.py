"""Our users' cases on one GPU: protection's cost at the snapshot bytes per second of step of each 7B example.

Items (each a ratio of medians, protected / unprotected step, with its 95 % bootstrap interval, from
protection on and off interleaved in one process, :func:`phoenix_hpc.gpucheck.protect.abba`; at least
:data:`KEPT_PER_MODE` kept steps per mode), each measured twice, in two processes: with the environment as
it is (``default``) and with ``CUDA_DEVICE_MAX_CONNECTIONS=1`` (``one_connection``: what Megatron-LM requires
with tensor or sequence parallelism before Blackwell, and what our 7B examples' jobs run with), which makes
every stream's work go through one hardware queue in call order. An item passes when the ratio of every
variant is at most its target (:data:`TARGETS`); a ratio above it is ``failed`` with its numbers.

- ``d2h.perlmutter_7b`` / ``d2h.vista_7b``: the per-GPU snapshot of ``examples/perlmutter-7b.yaml`` /
  ``examples/vista-7b.yaml`` (the project's own memory estimate, :func:`example_rate`: the optimizer shard
  plus the weights of the rank that holds the most) over the example's step time (its tokens per step over
  its GPUs times the tokens per second per GPU the example assumes, :data:`ASSUMED_TOKENS_PER_GPU_S`) gives
  bytes of snapshot per second of step; on one GPU a smaller model (:data:`USER_MODEL`) is trained with as
  many micro-batches per step as make its step that long for its own snapshot (:func:`micro_batches_for`);
- ``d2h.harsh``: the 1.01B model of check ``d2h`` (14 bytes per parameter, about 14 GB of snapshot per
  160-180 ms step on an H200: about 90 GB/s) with the adaptive protection interval
  (``resilience.protect_every_max``: :data:`HARSH_INTERVAL_MAX`);
- ``d2h.contention``: the unprotected step of the user-case model beside a thread that repeats the D2H copy
  back to back, over the unprotected step alone (:func:`phoenix_hpc.gpucheck.protect.contention`'s ``copy``);
  the same beside the copy in 4 MiB commands (``copy_chunked_ratio``, the remedy
  ``resilience.d2h_copy_chunk_bytes`` offers) is reported, not judged.

A case that does not fit the device's free memory or its share of the time budget is sized down (fewer
layers, :func:`fit_layers`) and its item says so (``sized_down``). The run happens in child processes
(``python -m phoenix_hpc.gpucheck.check_cases VARIANT WORK OUT``), since ``CUDA_DEVICE_MAX_CONNECTIONS`` is
read when the CUDA context is created.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

from phoenix_hpc.gpucheck import common
from phoenix_hpc.gpucheck.report import item

NAME = "cases"
TIMEOUT_S = 200
ITEMS = ("d2h.perlmutter_7b", "d2h.vista_7b", "d2h.harsh", "d2h.contention")
TARGETS = {"d2h.perlmutter_7b": 1.02, "d2h.vista_7b": 1.02, "d2h.harsh": 1.10, "d2h.contention": 1.05}
#: the two environments every case runs under (one child process each)
VARIANTS = {"default": {}, "one_connection": {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}}
EXAMPLES_DIR = Path(__file__).resolve().parents[2] / "examples"
#: tokens per second per GPU each example's step time assumes (the ``Time:`` comment of its ``training``
#: section; a unit test ties each number to its file)
ASSUMED_TOKENS_PER_GPU_S = {"perlmutter-7b.yaml": 2650.0, "vista-7b.yaml": 7400.0}
USER_CASES = {"d2h.perlmutter_7b": ("perlmutter-7b.yaml", "perlmutter"), "d2h.vista_7b": ("vista-7b.yaml", "vista")}
#: the one-GPU model of the users' cases: about 15 M parameters, 0.21 GB of snapshot (14 bytes per parameter)
USER_MODEL = {"layers": 2, "hidden_size": 768, "heads": 8, "vocab_size": 256, "seq_length": 1024,
              "dtype": "bfloat16"}
USER_MBS = 4
HARSH_INTERVAL_MAX = 4
ROUNDS, BLOCK_STEPS, DROP_FIRST = 2, 4, 1  # ABBA (on, off, off, on): 2 blocks per mode, 3 kept steps each
KEPT_PER_MODE = ROUNDS * (BLOCK_STEPS - DROP_FIRST)
#: steps a user case trains at its full size: a calibration step pair, then the ABBA blocks
CASE_STEPS = 2 + 2 * ROUNDS * BLOCK_STEPS
CONTENTION_STEPS = KEPT_PER_MODE + 1  # the first step of each block is dropped
SNAPSHOT_BYTES_PER_PARAM = 14  # bf16 weights + fp32 main, exp_avg, exp_avg_sq (the torch engine's shard, dp=1)
#: device bytes per parameter the harsh case is sized with: the snapshot's 14, fp32 gradients 4, and 6 for
#: activations and the allocator (an allowance, not a measurement)
DEVICE_BYTES_PER_PARAM = 24
#: seconds of each variant's child process (the check's timeout holds both; less when the runner gave less)
VARIANT_BUDGET_S = 100.0
#: seconds per variant for each user case's steps (the rest: process start, model builds, calibration), at a
#: full :data:`VARIANT_BUDGET_S`; scaled down with it (``PHOENIX_CASES_SCALE``)
CASE_BUDGET_S = {"d2h.perlmutter_7b": 25.0, "d2h.vista_7b": 12.0}
#: set by :func:`run` for the child: the share of :data:`VARIANT_BUDGET_S` it got
SCALE_ENV = "PHOENIX_CASES_SCALE"
#: set by the runner (:func:`phoenix_hpc.gpucheck.run.run_check`): the wall-clock time (``time.time()``) at
#: which the check's process is killed
DEADLINE_ENV = "PHOENIX_GPU_CHECK_DEADLINE"


def example_rate(name: str, tokens_per_gpu_s: float | None = None) -> dict:
    """Bytes of snapshot per second of step of one GPU of example ``name`` (a file of ``examples/``): the
    snapshot is the optimizer shard plus the weights of the rank whose stage needs the most
    (:func:`phoenix_hpc.config.memory.estimate_gpu_memory`, with dp = nodes x the site's GPUs per node /
    (tp x pp)); the step time is ``global_batch_size x seq_length / (GPUs x tokens_per_gpu_s)``, the
    example's own assumption (:data:`ASSUMED_TOKENS_PER_GPU_S`) unless given. CPU only."""
    from phoenix_hpc.config.load import load_job_config
    from phoenix_hpc.config.memory import estimate_gpu_memory

    cfg = load_job_config(EXAMPLES_DIR / name)
    site = {"perlmutter-7b.yaml": "perlmutter", "vista-7b.yaml": "vista"}[name]
    from phoenix_hpc.profiles.load import load_profile

    gpn = load_profile(site).node.gpus_per_node
    p = cfg.parallelism
    gpus = cfg.resources.nodes * gpn
    dp = p.dp or gpus // (p.tp * p.pp)
    est = estimate_gpu_memory(cfg, dp)
    snap = est.optimizer + est.weights
    rate_tok = ASSUMED_TOKENS_PER_GPU_S[name] if tokens_per_gpu_s is None else tokens_per_gpu_s
    step_s = cfg.training.global_batch_size * cfg.model.seq_length / (gpus * rate_tok)
    return {"example": name, "tp": p.tp, "pp": p.pp, "dp": dp, "gpus": gpus, "snapshot_bytes_per_gpu": round(snap),
            "step_s": round(step_s, 3), "bytes_per_step_s": round(snap / step_s),
            "sequence_parallel": bool(cfg.megatron.sequence_parallel)}


def param_count(model: dict) -> int:
    from phoenix_hpc.gpucheck.check_d2h import param_count as pc

    return pc(model["layers"], model["hidden_size"], model["vocab_size"], model["seq_length"])


def micro_batches_for(snapshot_bytes: int, bytes_per_step_s: float, micro_batch_s: float) -> int:
    """Micro-batches per step that make a step of ``micro_batch_s`` seconds per micro-batch last
    ``snapshot_bytes / bytes_per_step_s`` seconds (at least 1; pure)."""
    return max(1, round(snapshot_bytes / bytes_per_step_s / micro_batch_s))


def fit_layers(layers: int, step_s: float, steps: int, budget_s: float, layer_bytes: float, free_bytes: float) -> int:
    """Layers of a case that fits: its ``steps`` steps of ``step_s`` seconds within ``budget_s`` (the step,
    made to match a fixed bytes-per-second, shrinks with the snapshot, so with the layers) and its layers'
    ``layer_bytes`` of device memory each within ``free_bytes``; ``layers`` when it fits, at least 1 (pure)."""
    fit = layers
    if steps * step_s > budget_s:
        fit = min(fit, int(layers * budget_s / (steps * step_s)))
    if layer_bytes * layers > free_bytes:
        fit = min(fit, int(free_bytes / layer_bytes))
    return max(1, fit)


def variant_timeout(left_s: float, variants_left: int) -> float:
    """Seconds for the next variant's process: :data:`VARIANT_BUDGET_S`, or an equal share of ``left_s``
    (minus 5 s for the check's own end) among the ``variants_left`` still to run when that is less (pure)."""
    return max(1.0, min(VARIANT_BUDGET_S, (left_s - 5.0) / max(1, variants_left)))


def plan(work: Path) -> dict:
    """Dry run: each user case's bytes per second of step from its example, the one-GPU models and the
    harsh case's config (no CUDA call)."""
    from phoenix_hpc.gpucheck import check_d2h

    out = {k: {**example_rate(ex), "one_gpu_model": USER_MODEL,
               "one_gpu_snapshot_bytes": param_count(USER_MODEL) * SNAPSHOT_BYTES_PER_PARAM}
           for k, (ex, _) in USER_CASES.items()}
    out["d2h.harsh"] = {"model": check_d2h.MODEL, "params": param_count(check_d2h.MODEL),
                        "protect_every_max": HARSH_INTERVAL_MAX}
    out["variants"] = VARIANTS
    out["targets"] = TARGETS
    out["kept_steps_per_mode"] = KEPT_PER_MODE
    common.job_config("torch", common.dataset(work), USER_MODEL, user_training(1))
    check_d2h.config(work)
    return out


def user_training(micro_batches: int) -> dict:
    return {"steps": 100000, "micro_batch_size": USER_MBS, "global_batch_size": USER_MBS * micro_batches,
            "lr": 1e-4, "warmup_steps": 2, "seed": 3}


def verdict(name: str, by_variant: dict[str, dict], notes: list[str]) -> dict:
    """The item of case ``name`` from each variant's numbers (``ratio``, ``ratio_ci95``...; an ``error``
    where the variant failed): ``failed`` when a variant failed or its ratio is above :data:`TARGETS`
    (pure)."""
    target = TARGETS[name]
    nums: dict = {"target_ratio": target}
    why = []
    for v, n in by_variant.items():
        for k, val in n.items():
            nums[f"{v}.{k}"] = val
        if "error" in n:
            why.append(f"{v}: {n['error']}")
        elif n.get("ratio") is None:
            why.append(f"{v}: no ratio")
        elif n["ratio"] > target:
            why.append(f"{v}: ratio {n['ratio']} > target {target} (95 % interval {n.get('ratio_ci95')})")
    for v in VARIANTS:
        if v not in by_variant:
            why.append(f"{v}: not measured")
    if "default" in by_variant and "ratio" in by_variant["default"]:
        nums["ratio"] = by_variant["default"]["ratio"]
        nums["ratio_ci95"] = by_variant["default"].get("ratio_ci95")
    if notes:
        nums["sized_down"] = "; ".join(notes)
    return item(name, "failed" if why else "passed", "; ".join(why), nums, common.ONE_RANK)


# --- on the GPU (child processes) ---------------------------------------------------------------------------

def _engine(cfg, dev):
    import torch.distributed as dist

    from phoenix_hpc.engines.factory import create_engine
    from phoenix_hpc.launch.groups import Grid, init_generation

    if dist.is_initialized():
        dist.destroy_process_group()
    cuda = dev.type == "cuda"
    groups, coord = init_generation(dist.HashStore(), 0, 0, Grid(1, 1, 1), "nccl" if cuda else "gloo", 300.0,
                                    **({"device_id": dev} if cuda else {}))
    return create_engine(cfg, coord, groups, dev)


def _abba(engine, tokens: int, dev, interval_cap: int = 1) -> dict:
    from mpi4py import MPI

    from phoenix_hpc.gpucheck import protect
    from phoenix_hpc.launch.loop import train

    train(engine, engine.step + 2, tokens)
    prot = protect.make_protector(engine, MPI.COMM_WORLD, dev, interval_cap=interval_cap)
    try:
        steps = protect.abba(engine, prot, tokens, ROUNDS, BLOCK_STEPS)
        out = protect.summarize_abba(steps, drop_first=DROP_FIRST, trim=0.0)
        out["protected_steps"] = sum(1 for s in steps if s["mode"] == "on")
        if interval_cap > 1:
            out["interval_chosen"] = getattr(prot, "interval", None)
        prot.flush(engine)
        bad = protect.snapshot_matches(prot, engine)
        if bad:
            out["error"] = f"committed snapshot differs from the live state in {bad[:3]}"
        return out
    finally:
        prot.close()


def _free_bytes(dev) -> int:
    """Free memory of ``dev``: the device's (CUDA), else the host's MemAvailable."""
    import torch

    if dev.type == "cuda":
        return int(torch.cuda.mem_get_info(dev)[0])
    from phoenix_hpc.runtime.buffers import read_mem_available

    return read_mem_available()


def _user_case(name: str, work: Path, dev, rate: float, notes: list[str]) -> dict:
    import torch

    from phoenix_hpc.launch.loop import train

    model = dict(USER_MODEL)
    cfg = common.job_config("torch", common.dataset(work), model, user_training(1))
    eng = _engine(cfg, dev)
    tokens = USER_MBS * model["seq_length"]
    recs = train(eng, 3, tokens)
    mb_s = min(r.step_time_ms for r in recs[1:]) / 1e3  # one micro-batch per step
    snap = sum(t.numel() * t.element_size() for _, t in eng.optimizer_shard() + eng.param_shard())
    step_s = snap / rate
    free = _free_bytes(dev)
    budget = CASE_BUDGET_S[name] * float(os.environ.get(SCALE_ENV) or 1.0)
    layers = fit_layers(model["layers"], step_s, CASE_STEPS, budget,
                        snap / model["layers"], free)
    if layers < model["layers"]:
        notes.append(f"{model['layers']} -> {layers} layers: {CASE_STEPS} steps of "
                     f"{step_s:.2f} s did not fit the {budget:.0f} s budget or {free} bytes free on the device")
        model["layers"] = layers
        del eng
        eng = _engine(common.job_config("torch", common.dataset(work), model, user_training(1)), dev)
        train(eng, 2, tokens)
        snap = sum(t.numel() * t.element_size() for _, t in eng.optimizer_shard() + eng.param_shard())
    k = micro_batches_for(snap, rate, mb_s)
    del eng
    eng = _engine(common.job_config("torch", common.dataset(work), model, user_training(k)), dev)
    out = _abba(eng, k * tokens, dev)
    out.update({"snapshot_bytes": snap, "micro_batches": k, "micro_batch_s": round(mb_s, 4),
                "bytes_per_step_s_target": round(rate),
                "bytes_per_step_s": round(snap / (out["off_ms_median"] / 1e3)), "layers": model["layers"]})
    return out


def child(variant: str, work: Path, result: Path) -> int:
    """One variant's measurements of every case on CUDA device 0, written to ``result`` as ``{case:
    numbers}`` after each case (:func:`measure`)."""
    dev = common.prepare_cuda()
    res: dict = {"_env": {k: os.environ.get(k) for k in ("CUDA_DEVICE_MAX_CONNECTIONS",)}}

    def save() -> None:  # after every case: a later hang or crash keeps what was measured
        tmp = result.with_name(result.name + ".tmp")
        tmp.write_text(json.dumps(res))
        os.replace(tmp, result)

    measure(work, dev, res, save)
    return 0


def measure(work: Path, dev, res: dict, save) -> None:
    """Every case on ``dev`` (CUDA; CPU in the unit test), each case's numbers (or ``error``) into ``res``
    and ``save()`` called after each; sizing notes in ``res["_notes"]``."""
    import traceback

    from phoenix_hpc.gpucheck import check_d2h, protect
    from phoenix_hpc.launch.loop import train

    res.setdefault("_notes", {})
    for name, (ex, _) in USER_CASES.items():
        notes: list[str] = []
        try:
            res[name] = _user_case(name, work, dev, example_rate(ex)["bytes_per_step_s"], notes)
        except Exception as e:  # noqa: BLE001 -- the item names it; the log has the traceback
            traceback.print_exc()
            res[name] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
        res["_notes"][name] = notes
        save()
    try:  # contention: the user-case model's unprotected step beside a back-to-back D2H copy
        from mpi4py import MPI

        eng = _engine(common.job_config("torch", common.dataset(work), USER_MODEL, user_training(4)), dev)
        tokens = 4 * USER_MBS * USER_MODEL["seq_length"]
        train(eng, 2, tokens)
        prot = protect.make_protector(eng, MPI.COMM_WORLD, dev)
        prot.close()
        local = prot.buffers.local
        buf = local.begin_write(local.target_idx())
        c = protect.contention(eng, prot, buf, tokens, CONTENTION_STEPS, kinds=("copy", "copy_chunked"))
        r = protect.steps_ratio(c["copy_steps_ms"], c["alone_steps_ms"])
        rc = protect.steps_ratio(c["copy_chunked_steps_ms"], c["alone_steps_ms"])  # the remedy, as a diagnosis
        res["d2h.contention"] = {**r, "kept_steps": len(c["copy_steps_ms"]), "copy_chunked_ratio": rc["ratio"],
                                 "copy_chunked_ratio_ci95": rc["ratio_ci95"], **c}
    except Exception as e:  # noqa: BLE001
        traceback.print_exc()
        res["d2h.contention"] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
    save()
    try:
        cfg = check_d2h.config(work)
        model = dict(check_d2h.MODEL)
        per_layer = DEVICE_BYTES_PER_PARAM * (12 * model["hidden_size"] ** 2 + 13 * model["hidden_size"])
        layers = fit_layers(model["layers"], 0.0, 0, 1.0, per_layer, 0.8 * _free_bytes(dev))
        scale = min(1.0, float(os.environ.get(SCALE_ENV) or 1.0))
        if layers < model["layers"]:
            res["_notes"]["d2h.harsh"] = [f"{model['layers']} -> {layers} layers: {DEVICE_BYTES_PER_PARAM} bytes per "
                                          f"parameter did not fit 80 % of the device's free memory"]
        if scale < 1.0 and int(layers * scale) < layers:  # its steps and its build shrink with its layers
            res["_notes"].setdefault("d2h.harsh", []).append(
                f"{layers} -> {max(1, int(layers * scale))} layers: {scale:.2f} of the variant's time was left")
            layers = max(1, int(layers * scale))
        if layers < model["layers"]:
            model["layers"] = layers
            cfg = common.job_config("torch", common.dataset(work), model, check_d2h.TRAINING)
            res["_notes"]["d2h.harsh"].append(f"{param_count(model)} parameters instead of "
                                              f"{param_count(check_d2h.MODEL)}")
        eng = _engine(cfg, dev)
        res["d2h.harsh"] = _abba(eng, cfg.training.global_batch_size * cfg.model.seq_length, dev, HARSH_INTERVAL_MAX)
    except Exception as e:  # noqa: BLE001
        traceback.print_exc()
        res["d2h.harsh"] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
    save()


def run(work: Path) -> list[dict]:
    """Both variants in turn, each in a child process; then one item per case."""
    per: dict[str, dict] = {n: {} for n in ITEMS}
    notes: dict[str, list[str]] = {n: [] for n in ITEMS}
    deadline = float(os.environ.get(DEADLINE_ENV) or time.time() + 2 * VARIANT_BUDGET_S + 10)
    for i, (variant, env) in enumerate(VARIANTS.items()):
        result = Path(work) / f"cases.{variant}.json"
        result.unlink(missing_ok=True)
        cmd = [sys.executable, "-m", "phoenix_hpc.gpucheck.check_cases", variant, str(work), str(result)]
        t0 = time.perf_counter()
        limit = variant_timeout(deadline - time.time(), len(VARIANTS) - i)
        scale = limit / VARIANT_BUDGET_S
        if scale < 1:
            for n in ITEMS:
                notes[n].append(f"{variant}: {limit:.0f} s of the {VARIANT_BUDGET_S:.0f} s a variant takes were left; "
                                f"the users' cases' step budgets scaled by {scale:.2f}")
        why = ""
        try:
            rc = subprocess.run(cmd, env={**os.environ, **env, SCALE_ENV: f"{min(1.0, scale):.3f}"},
                                timeout=limit).returncode
            why = "" if rc == 0 else f"the variant's process exited {rc}"
        except subprocess.TimeoutExpired:
            why = f"the variant's process ran past {limit:.0f} s"
        got = {}
        try:
            got = json.loads(result.read_text())
        except (OSError, ValueError):
            why = why or "the variant's process wrote no result"
        for n in ITEMS:
            if n in got:
                per[n][variant] = {**got[n], "wall_s": round(time.perf_counter() - t0, 1)}
            elif why:
                per[n][variant] = {"error": why}
            for note in got.get("_notes", {}).get(n, []):
                notes[n].append(f"{variant}: {note}")
    return [verdict(n, per[n], notes[n]) for n in ITEMS]


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] not in VARIANTS:
        print(f"usage: python -m {__name__} {{{','.join(VARIANTS)}}} WORK RESULT", file=sys.stderr)
        sys.exit(2)
    sys.exit(child(sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])))
