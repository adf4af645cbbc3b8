"""What runs a target for the engine: `local` (a loaded model and its own KV cache, on transformers or the
native forward) and `served` (a target in vLLM or llama.cpp's server, the draft here).
Imports models, native and the top-level modules; never drafters or the engine.
"""
