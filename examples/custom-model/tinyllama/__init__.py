"""A small Llama-style decoder (RMSNorm, SwiGLU, rotary position embeddings) trained by phoenix_hpc's torch
engine through ``model.factory: tinyllama.model:build_stage`` (see ../job.yaml and docs/engines.md)."""
