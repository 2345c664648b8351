"""The one-GPU check: what only a GPU can verify, run as one command (``scripts/gpu-check.sh``).

Each check is a module ``check_<name>`` with ``NAME``, ``TIMEOUT_S`` (seconds), ``ITEMS`` (the verdicts it
reports), ``plan(work)`` (the dry run: configs and imports, no CUDA call) and ``run(work)`` (on CUDA device
0; returns one :func:`phoenix_hpc.gpucheck.report.item` per name of ``ITEMS``). :mod:`.run` runs every
check in its own process under its timeout and writes the report. The pure parts (report, wheel matching,
link limits, ABBA analysis, Llama options) are unit-tested on CPU.
"""

#: Check modules in run order: the short ones first; host memory, the least news on one GPU, last.
CHECKS = ("nccl", "torch_engine", "torch_llama", "megatron", "megatron_ckpt", "d2h", "cases", "kit", "memory")
