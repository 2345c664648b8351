"""Megatron-LM's on-disk checkpoint layout (``--ckpt-format torch_dist``) and the submit-time check of a
checkpoint a job starts from: file reading and writing only (megatron-core only to read ``common.pt``,
:func:`read_common`; no tensor is read).

The layout, as Megatron-LM's ``megatron/training/checkpointing.py`` writes and reads it::

    DIR/
        latest_checkpointed_iteration.txt   text: the newest iteration N, or "release" (written last, after
                                            every rank finished its files)
        iter_NNNNNNN/                       one checkpoint, N zero-padded to 7 digits ("release/" for a
                                            release checkpoint)
            metadata.json                   {"sharded_backend": "torch_dist", ...} (megatron-core
                                            dist_checkpointing)
            .metadata, __R_I.distcp         torch.distributed.checkpoint files: the sharded tensors and
                                            objects ("model" keys such as
                                            "decoder.layers.self_attention.linear_qkv.weight", whose first
                                            dimension is the layer; "optimizer.*", "rng_state")
            common.pt                       the rest of the state dict: "args", "checkpoint_version",
                                            "iteration", "opt_param_scheduler", "content_metadata", ...

The tensors are stored at their global (unsharded) shapes, so the model shape can be read from ``.metadata``
(:func:`read_metadata`, once per check) and checked against the config before anything is submitted
(:func:`load_problems`). megatron-core re-partitions the model tensors over any tp and pp on load.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from phoenix_hpc.files import write_private_file

TRACKER = "latest_checkpointed_iteration.txt"
COMMON = "common.pt"  # megatron-core dist_checkpointing's COMMON_STATE_FNAME
FIELD_LOAD = "resilience.checkpoint.load_megatron"
FIELD_SAVE = "resilience.checkpoint.save_megatron"
#: the backends megatron-core's dist_checkpointing names in ``metadata.json`` that this loader reads
BACKENDS = ("torch_dist",)

#: The tensors whose global shapes decide the model fields (keys of megatron-core's GPTModel sharded state
#: dict: the local and the Transformer Engine layer specs use the same keys; layers stacked on dimension 0).
EMBEDDING = "embedding.word_embeddings.weight"
POSITION = "embedding.position_embeddings.weight"
QKV = "decoder.layers.self_attention.linear_qkv.weight"
PROJ_BIAS = "decoder.layers.self_attention.linear_proj.bias"
NORM_BIAS = "decoder.layers.self_attention.linear_qkv.layer_norm_bias"
FC1 = "decoder.layers.mlp.linear_fc1.weight"
FC2 = "decoder.layers.mlp.linear_fc2.weight"
OUTPUT = "output_layer.weight"


def iter_dir(root: str | os.PathLike, iteration: int | str) -> Path:
    """``root/iter_{iteration:07d}`` (``root/release`` for ``"release"``)."""
    if iteration == "release":
        return Path(root) / "release"
    return Path(root) / f"iter_{int(iteration):07d}"


def read_tracker(root: str | os.PathLike) -> int | str:
    """The iteration ``root/latest_checkpointed_iteration.txt`` names: an int >= 0, or ``"release"``.

    Raises:
        ValueError: the file is missing, unreadable, or holds anything else; the message names the file and
            what is allowed.
    """
    p = Path(root) / TRACKER
    try:
        text = p.read_text().strip()
    except FileNotFoundError:
        raise ValueError(f"{p} does not exist (a Megatron-LM checkpoint directory has one, naming the "
                         "iteration to load)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{p} cannot be read ({type(exc).__name__}: {exc})") from None
    if text == "release":
        return "release"
    if not (text.isascii() and text.isdigit()):  # isdigit alone takes digits int() refuses, e.g. superscripts
        raise ValueError(f"{p} holds {text[:40]!r}; allowed: an iteration number (digits) or 'release'")
    return int(text)


def write_tracker(root: str | os.PathLike, iteration: int) -> Path:
    """Write ``root/latest_checkpointed_iteration.txt`` = ``iteration`` atomically (temporary file, rename),
    as the last file of a checkpoint. Returns its path."""
    p = Path(root) / TRACKER
    write_private_file(p, f"{int(iteration)}")
    return p


@dataclass(frozen=True)
class FolderMetadata:
    """What a torch_dist checkpoint folder's ``.metadata`` says: the global shapes of its tensors by key
    (``shapes``) and every DCP key, tensors and objects (``keys``: e.g. ``rng_state/shard_...``)."""

    shapes: dict[str, tuple[int, ...]]
    keys: frozenset[str]


def read_metadata(d: str | os.PathLike) -> FolderMetadata:
    """The torch_dist checkpoint folder ``d`` (``iter_NNNNNNN``): its ``metadata.json`` backend checked, its
    ``.metadata`` read once (``torch.distributed.checkpoint.FileSystemReader``; no tensor is read).

    Raises:
        ValueError: ``metadata.json`` names another backend, or ``.metadata`` is missing or unreadable.
    """
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    d = Path(d)
    try:
        backend = json.loads((d / "metadata.json").read_text()).get("sharded_backend")
    except (OSError, ValueError, AttributeError) as exc:
        raise ValueError(f"{d / 'metadata.json'} cannot be read ({type(exc).__name__}); a torch_dist checkpoint "
                         "folder has one") from None
    if backend not in BACKENDS:
        raise ValueError(f"{d / 'metadata.json'}: sharded_backend {backend!r}; allowed: {', '.join(BACKENDS)} "
                         "(Megatron-LM's --ckpt-format torch_dist)")
    try:
        meta = FileSystemReader(str(d)).read_metadata()
    except Exception as exc:  # pickle, I/O and format errors alike: the checkpoint cannot be used
        raise ValueError(f"{d / '.metadata'} cannot be read ({type(exc).__name__}: {exc})") from None
    shapes = {k: tuple(int(x) for x in v.size) for k, v in meta.state_dict_metadata.items()
              if isinstance(v, TensorStorageMetadata)}
    return FolderMetadata(shapes, frozenset(meta.state_dict_metadata))


def shape_of_checkpoint(d: str | os.PathLike) -> dict[str, tuple[int, ...]]:
    """Global shapes of the tensors in the torch_dist checkpoint folder ``d``, by key (:func:`read_metadata`;
    raises ValueError as it does)."""
    return read_metadata(d).shapes


def has_optimizer(shapes: dict[str, tuple[int, ...]]) -> bool:
    """Whether a checkpoint with these tensors holds optimizer state (keys under ``optimizer.``)."""
    return any(k.startswith("optimizer.") for k in shapes)


def start_iteration(root: str | os.PathLike) -> int:
    """The step a run started from Megatron-LM checkpoint directory ``root`` begins at: the tracker's
    iteration when that checkpoint holds optimizer state, else 0 (weights only, or ``release``: a new run
    from these weights, as Megatron-LM's ``--finetune``). Raises ValueError as :func:`read_tracker` and
    :func:`shape_of_checkpoint` do."""
    it = read_tracker(root)
    if it == "release":
        return 0
    return int(it) if has_optimizer(shape_of_checkpoint(iter_dir(root, it))) else 0


def written_grid(keys) -> tuple[int, int] | None:
    """``(tp, pp)`` a torch_dist checkpoint was written at, from the DCP keys of its ``rng_state`` objects
    (``rng_state/shard_{pp}.{tp}_{PP}.{TP}``, Megatron-LM's ``get_rng_state``); None without them."""
    for k in keys:
        m = re.match(r"^rng_state/shard_\d+\.\d+_(\d+)\.(\d+)$", k)
        if m:
            return int(m.group(2)), int(m.group(1))
    return None


def expected_shapes(model) -> dict[str, tuple[int, ...] | None]:
    """The global shapes megatron-core's GPTModel gives the tensors of :data:`EMBEDDING` ... :data:`OUTPUT`
    for the ``model`` section of a config (None: the tensor must be absent). ``qkv`` rows:
    ``(heads + 2 x query groups) x hidden / heads``; ``fc1`` rows: ``2 x ffn`` with SwiGLU (gate and up),
    else ``ffn``; position embeddings: ``seq_length`` rows (megatron-core's ``max_sequence_length``)."""
    h, n, kv = model.hidden_size, model.layers, model.hidden_size // model.heads
    ffn = model.ffn_size
    return {
        EMBEDDING: (model.vocab_size, h),
        POSITION: (model.seq_length, h) if model.position_embedding_type == "learned_absolute" else None,
        QKV: (n, (model.heads + 2 * model.query_groups) * kv, h),
        FC1: (n, ffn * (2 if model.activation == "swiglu" else 1), h),
        FC2: (n, h, ffn),
        OUTPUT: (model.vocab_size, h),  # written with tied embeddings too (the embedding's values)
        PROJ_BIAS: (n, h) if model.add_bias_linear else None,
        NORM_BIAS: (n, h) if model.normalization == "LayerNorm" else None,
    }


#: which config fields decide each tensor's shape or presence (named in a refusal)
FIELDS_OF = {
    EMBEDDING: "model.vocab_size / model.hidden_size",
    POSITION: "model.position_embedding_type / model.seq_length",
    QKV: "model.layers / model.heads / model.num_query_groups / model.hidden_size",
    FC1: "model.ffn_hidden_size / model.activation",
    FC2: "model.ffn_hidden_size / model.hidden_size",
    OUTPUT: "model.vocab_size / model.hidden_size",
    PROJ_BIAS: "model.add_bias_linear",
    NORM_BIAS: "model.normalization",
}


def shape_problems(where: str, shapes: dict[str, tuple[int, ...]], model,
                   keys: tuple[str, ...] | None = None) -> list[str]:
    """Where the checkpoint's tensor shapes (``shapes``, of folder ``where``) differ from those of the config's
    ``model`` (:func:`expected_shapes`; only ``keys`` when given): one problem per tensor, naming the config
    fields that decide it, the checkpoint's shape and the config's."""
    out = []
    for key, want in expected_shapes(model).items():
        if keys is not None and key not in keys:
            continue
        got = shapes.get(key)
        if got == want:
            continue
        say = lambda s: "absent" if s is None else str(tuple(s))  # noqa: E731
        out.append(f"{FIELD_LOAD}: {where} is of another model shape: tensor {key} is {say(got)} there, "
                   f"{say(want)} for this config ({FIELDS_OF[key]}); allowed: a checkpoint of the config's model")
    return out


def _not_here(cfg, resuming: bool, on_cluster: bool) -> bool:
    """``load_megatron`` is left to the ranks: ``on_cluster`` (``phoenix submit --data-on-cluster``), a
    checkpoint to load (not ``resuming``) and its folder not a directory on this machine."""
    d = cfg.resilience.checkpoint.load_megatron
    return on_cluster and not resuming and d is not None and not Path(d).is_dir()


def load_not_checked(cfg, resuming: bool = False, on_cluster: bool = False) -> str | None:
    """The warning of a submit that leaves ``load_megatron`` to the ranks (:func:`load_problems` with
    ``on_cluster``: its folder is not here), naming what was not checked; None otherwise."""
    if not _not_here(cfg, resuming, on_cluster):
        return None
    return (f"{FIELD_LOAD}: {cfg.resilience.checkpoint.load_megatron} is not a directory here, so its {TRACKER}, "
            "the iteration folder it names, its backend, model shape, optimizer grid and learning-rate schedule were "
            "not checked (--data-on-cluster: the ranks check them when they load it, before they train)")


def _start_fresh_hint(ck) -> str:
    """For a ``load_megatron`` that is also ``save_megatron``: how to start from scratch there instead
    (Megatron-LM's ``--save DIR --load DIR`` before DIR holds a checkpoint)."""
    if ck.save_megatron is None or os.path.normpath(ck.load_megatron) != os.path.normpath(ck.save_megatron):
        return ""
    return (f"; it is also {FIELD_SAVE}: to start from scratch and write the Megatron-LM checkpoints there (what "
            f"Megatron-LM does with --save DIR --load DIR while DIR holds no {TRACKER}), leave out load_megatron "
            "(a resubmitted job continues from its own checkpoints)")


def overwrite_problems(cfg, resuming: bool, has_own_checkpoint: bool) -> list[str]:
    """A ``save_megatron`` folder (here, absolute) that already holds Megatron-LM's tracker which this job would
    replace: the job does not continue from it (no ``load_megatron`` naming that folder), is not resumed
    (``resuming``: ``phoenix submit --resume``) and has no complete checkpoint of its own to continue from
    (``has_own_checkpoint``: one in ``resilience.checkpoint.path``, as the submit finds it for the run
    directory). Its first Megatron-LM checkpoint would then rewrite
    ``latest_checkpointed_iteration.txt``, so Megatron-LM's ``--load`` would no longer find the iteration it
    names now (typically: Megatron-LM wrote a checkpoint into the ``--save`` folder after ``phoenix config
    from-megatron`` converted an auto-resume script). One problem naming the folder and the ways out, or none."""
    ck = cfg.resilience.checkpoint
    if ck.save_megatron is None or resuming or has_own_checkpoint or not os.path.isabs(ck.save_megatron):
        return []
    root = Path(ck.save_megatron)
    if not (root / TRACKER).is_file():
        return []
    if ck.load_megatron is not None and os.path.normpath(ck.load_megatron) == os.path.normpath(ck.save_megatron):
        return []
    try:
        it = f"iteration {read_tracker(root)}"
    except ValueError:
        it = "unreadable"
    return [f"{FIELD_SAVE}: {root} already holds {TRACKER} ({it}), which this job did not write and does not "
            "continue from; its first Megatron-LM checkpoint would replace it; allowed: "
            f"resilience.checkpoint.load_megatron: {root} (continue from that checkpoint), another folder for "
            "save_megatron, or removing that file first to start over there knowingly"]


def load_problems(cfg, resuming: bool = False, on_cluster: bool = False) -> list[str]:
    """Submit-time problems of ``resilience.checkpoint.load_megatron`` and ``save_megatron`` (empty: none).
    ``resuming`` (``phoenix submit --resume``): the run continues from its own newest complete checkpoint and
    never loads ``load_megatron``'s, so only the fields are checked, not that checkpoint. ``on_cluster``
    (``phoenix submit --data-on-cluster``, not on site local): a ``load_megatron`` folder that is not a
    directory here is only on the cluster's file systems, so only the fields are checked
    (:func:`load_not_checked` names what was not); one that is here is checked in full.

    ``load_megatron``: engine ``megatron`` only; an absolute path to a directory with
    ``latest_checkpointed_iteration.txt`` naming an ``iter_NNNNNNN`` (or ``release``) folder that exists and
    is a torch_dist checkpoint of the config's model shape (:func:`shape_problems`; with ``model.provider``
    only the embedding and the layer count are checked, the provider decides the rest); with optimizer state,
    an iteration below ``training.steps``, the config's learning-rate schedule equal to the checkpoint's
    scheduler state (:func:`scheduler_problems`) and the job's tp and pp when that state can be re-partitioned
    over dp only (:func:`written_grid`). ``save_megatron``:
    engine ``megatron`` only, an absolute path, persistent checkpoints on (``resilience.enabled``, mode
    ``phoenix`` or ``checkpoint-restart``). Reads the tracker file, the ``.metadata`` file and, with optimizer
    state, ``common.pt``."""
    ck = cfg.resilience.checkpoint
    out: list[str] = []
    for fld, val in ((FIELD_LOAD, ck.load_megatron), (FIELD_SAVE, ck.save_megatron)):
        if val is None:
            continue
        if cfg.engine != "megatron":
            out.append(f"{fld}: value {val!r} -- engine {cfg.engine!r} cannot read or write Megatron-LM "
                       "checkpoints; allowed with engine: megatron")
        if not os.path.isabs(val):
            out.append(f"{fld}: value {val!r} is a relative path; allowed: an absolute path (the ranks run in the "
                       "run directory, submit in the current one)")
    if ck.save_megatron is not None and not (cfg.resilience.enabled
                                             and cfg.resilience.mode in ("phoenix", "checkpoint-restart")):
        out.append(f"{FIELD_SAVE}: value {ck.save_megatron!r} -- no persistent checkpoint is written with "
                   "resilience.enabled false; allowed with resilience.enabled true")
    if out or ck.load_megatron is None or resuming or _not_here(cfg, resuming, on_cluster):
        return out
    root = Path(ck.load_megatron)
    if not root.is_dir():
        return [f"{FIELD_LOAD}: {root} is not a directory; allowed: a Megatron-LM checkpoint directory "
                f"(the one Megatron-LM's --load names, holding {TRACKER}){_start_fresh_hint(ck)}"]
    try:
        it = read_tracker(root)
    except ValueError as exc:
        return [f"{FIELD_LOAD}: {exc}{_start_fresh_hint(ck)}"]
    d = iter_dir(root, it)
    if not d.is_dir():
        return [f"{FIELD_LOAD}: {root / TRACKER} names iteration {it}, and {d} does not exist; allowed: the "
                "iteration of a checkpoint folder in the directory"]
    try:
        meta = read_metadata(d)  # the one read of .metadata in a submit
    except ValueError as exc:
        return [f"{FIELD_LOAD}: {exc}"]
    shapes = meta.shapes
    keys = (EMBEDDING,) if cfg.model.provider is not None else None
    out = shape_problems(str(d), shapes, cfg.model, keys)
    if has_optimizer(shapes) and it != "release" and int(it) >= cfg.training.steps:
        out.append(f"{FIELD_LOAD}: {d} is at iteration {it}, and the run continues from it to training.steps "
                   f"= {cfg.training.steps}: nothing would be trained; allowed: training.steps > {it}")
    if has_optimizer(shapes) and it != "release":
        out += scheduler_problems(d, cfg, int(it))
    grid = written_grid(meta.keys)
    job = (cfg.parallelism.tp, cfg.parallelism.pp)
    if grid is not None and grid != job and any(k.startswith("optimizer.distributed.dp_group_idx") for k in meta.keys):
        out.append(f"{FIELD_LOAD}: {d} holds distributed-optimizer state written at (tp, pp) = {grid} in a layout "
                   f"megatron-core re-partitions over dp only; the job's (tp, pp) is {job}; allowed: "
                   f"parallelism.tp = {grid[0]} and parallelism.pp = {grid[1]}, or a checkpoint without optimizer "
                   "state (Megatron-LM: --no-save-optim) or saved with --dist-ckpt-optim-fully-reshardable")
    if cfg.model.provider is not None and QKV in shapes and shapes[QKV][0] != cfg.model.layers:
        out.append(f"{FIELD_LOAD}: {d} is of another model shape: {shapes[QKV][0]} layers there "
                   f"(tensor {QKV}), model.layers is {cfg.model.layers}")
    return out


def read_common(d: str | os.PathLike) -> dict:
    """The common state dict of the torch_dist checkpoint folder ``d``: ``common.pt`` (``args``, ``iteration``,
    ``checkpoint_version``, ``opt_param_scheduler``, ...: the non-sharded entries, no model or optimizer
    tensor), read with megatron-core's ``dist_checkpointing.load_common_state_dict`` (``torch.load`` on the CPU,
    weights only, with megatron-core's safe classes).

    Raises:
        ValueError: ``common.pt`` is missing or cannot be read; the message names the file.
        ImportError: megatron-core is not installed.
    """
    from megatron.core import dist_checkpointing

    p = Path(d) / COMMON
    if not p.is_file():
        raise ValueError(f"{p} does not exist (a torch_dist checkpoint folder holds one: its common state)")
    try:
        common = dist_checkpointing.load_common_state_dict(str(d))
    except Exception as exc:  # pickle, I/O and format errors alike: the checkpoint cannot be loaded either
        raise ValueError(f"{p} cannot be read ({type(exc).__name__}: {str(exc)[:300]})") from None
    if not isinstance(common, dict):
        raise ValueError(f"{p} holds a {type(common).__name__}, not a state dict")
    return common


def scheduler_problems(d: Path, cfg, iteration: int) -> list[str]:
    """Where the learning-rate scheduler saved in checkpoint folder ``d`` (``opt_param_scheduler`` of its
    ``common.pt``, :func:`read_common`) differs from the config's schedule in a way that changes the training
    (:func:`phoenix_hpc.engines.megatron_schedule.differences`): one problem per value, naming the file, the
    scheduler field, both values and what to change. Empty when they agree, when the checkpoint saved no
    scheduler, or without megatron-core (its version problem is reported instead)."""
    from phoenix_hpc.engines.megatron_schedule import differences, scheduler_of

    p = d / COMMON
    try:
        common = read_common(d)
    except ImportError:
        return []
    except ValueError as exc:
        return [f"{FIELD_LOAD}: {exc}"]
    found = scheduler_of(common)
    if found is None:
        return []
    key, sd = found
    return [f"{FIELD_LOAD}: {p}: {key}.{x.field} is {x.checkpoint!r} there and {x.config!r} for this config "
            f"({x.source}); continuing from it would change the learning-rate schedule it was trained with "
            f"(Megatron-LM refuses it too without --override-opt_param-scheduler); allowed: {x.change}"
            for x in differences(sd, cfg, iteration)]
