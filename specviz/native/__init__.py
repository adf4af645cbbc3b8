"""specviz's own CPU forward: C sources in `csrc/`, built and loaded by `library`; the Llama forward around them
(`forward`, with `kv_cache`, `panels`, `tiles`, `torch_layers`), a draft's round in one call (`chain`, `draft`,
`head`) and the linear layers' fast paths (`linear`). Imports host and the top-level modules only.
"""
