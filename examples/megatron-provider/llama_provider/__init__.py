"""A Llama-style decoder for phoenix_hpc's Megatron engine, built by a model-provider function
(:func:`llama_provider.provider.llama_stage`) from megatron-core's own GPTModel and layer specs."""
