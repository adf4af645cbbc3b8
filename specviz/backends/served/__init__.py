"""Served targets: `connect` (which engine is at an address, the run it gives), `run` (the rounds against vLLM),
`llamacpp` (the same against llama-cpp-python's server), `target` (the tokenizer and EOS here, the scores there)
and `http` (the one client, the /metrics counters).
"""
