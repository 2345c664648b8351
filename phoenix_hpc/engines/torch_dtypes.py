"""The parameter dtypes engine ``torch`` trains in, as data the config checks at load without importing torch
(:mod:`phoenix_hpc.config.schema`); the engine builds its models with the same list
(:mod:`phoenix_hpc.engines.torch_engine`)."""

from __future__ import annotations

#: ``model.dtype`` values engine ``torch`` accepts: no loss scaler, so not float16
TORCH_ENGINE_DTYPES = ("float32", "bfloat16")
