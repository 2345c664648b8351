"""``phoenix config from-megatron --engine torch``: a Megatron-LM job converted for the torch engine.

The model, training, data and parallelism fields are those of the conversion for engine ``megatron``
(:func:`phoenix_hpc.config.megatron_args.convert`); what differs is said here, as data and pure functions:

* the ``megatron`` section (megatron-core's performance options, :data:`OPTION_ARGS`) is not written: every
  such argument given is listed as not carried over (:data:`NO_SUCH_OPTION`);
* ``--save`` becomes ``resilience.checkpoint.path`` only: the torch engine writes no Megatron-LM checkpoints
  (:data:`SAVE_WHY`); a ``--load`` folder holding a Megatron-LM checkpoint is refused (:func:`load_refusal`),
  since the torch engine cannot read one;
* what the torch engine refuses (tensor parallelism, a tied output head, float16, ...) is refused by the job
  schema itself (:meth:`phoenix_hpc.config.schema.JobConfig._torch_engine_problems`), the single source of
  those rules; the command names each field with the Megatron-LM argument it came from and adds the
  arguments that meet each refusal (:func:`ways_note`).
"""

from __future__ import annotations

import re

#: ``--engine`` values of ``phoenix config from-megatron`` (the first is the default).
ENGINES = ("megatron", "torch")

#: The Megatron-LM arguments that become engine megatron's ``megatron`` section (megatron-core's performance
#: options); for engine torch each one given is listed as not carried over, with :data:`NO_SUCH_OPTION`.
OPTION_ARGS = ("--transformer-impl", "--attention-backend", "--recompute-granularity", "--recompute-activations",
               "--sequence-parallel")

NO_SUCH_OPTION = ("a megatron-core performance option (the config's megatron section, engine megatron only): the "
                  "torch engine has no such option; it does not change what is trained")

NOTE = ("engine torch (from-megatron --engine torch): the torch engine's built-in GPT (phoenix_hpc/engines/"
        "torch_gpt.py), on CPU or GPU; Megatron-LM's performance options (the megatron section) and Megatron-LM "
        "checkpoints are not written")

SAVE_WHY = ("carried over as resilience.checkpoint.path only (phoenix's own checkpoints, step_NNNNNNNN/): the torch "
            "engine writes no Megatron-LM checkpoints (iter_NNNNNNN/, latest_checkpointed_iteration.txt; "
            "resilience.checkpoint.save_megatron is engine megatron's)")

AUTO_RESUME_WHY = ("the same folder as --save, which holds no latest_checkpointed_iteration.txt yet: Megatron-LM "
                   "starts from scratch then (its auto-resume idiom), and so does this job; a resubmitted job, or "
                   "phoenix submit --resume RUN_DIR, continues from the newest checkpoint phoenix writes into that "
                   "folder (resilience.checkpoint.path)")


def load_refusal(folder: str) -> str:
    """The problem of a ``--load`` folder that holds a Megatron-LM checkpoint, converted for engine torch: the
    torch engine cannot read one (``resilience.checkpoint.load_megatron`` is engine megatron's). Pure."""
    return (f"--load: {folder!r} holds a Megatron-LM checkpoint (latest_checkpointed_iteration.txt), which engine "
            "torch cannot read (allowed: --engine megatron to start from it; or a line without --load, to start "
            "from scratch)")


#: For each field the torch engine refuses (the schema's message names it): the Megatron-LM arguments that meet
#: the refusal, as ``phoenix config from-megatron`` takes them.
WAYS = {
    "parallelism.tp": "tp 1: add --tensor-model-parallel-size 1 after -- (the last one given wins, as in "
                      "Megatron-LM; the vocabulary is then padded as Megatron-LM pads it at tp 1)",
    "model.untie_embeddings_and_output_weights": "an untied output head (Llama's): add "
                                                 "--untie-embeddings-and-output-weights",
    "model.dtype": "bfloat16: --bf16 instead of --fp16 (or neither, for float32)",
}


def ways_note(problems: list[str]) -> str | None:
    """The line printed after the schema's refusals of a config converted for engine torch: for every field of
    :data:`WAYS` that a problem refuses for engine torch, the Megatron-LM arguments that meet it, and
    ``--engine megatron``; None when no problem is the torch engine's. Pure."""
    ways = [way for dotted, way in WAYS.items()
            if any(re.search(rf"(?:^|; ){re.escape(dotted)}(?: \(from [^;]*?\))?: [^;]*?engine torch", p)
                   for p in problems)]
    if not ways and not any("engine torch" in p for p in problems):
        return None
    return ("nothing was written (each field names the Megatron-LM argument it came from). For engine torch: "
            + "".join(f"{w}; " for w in ways) + "or convert for engine megatron with --engine megatron")
