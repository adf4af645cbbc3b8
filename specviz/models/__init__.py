"""Loading models: hub ids, local folders and the built-in pair (`hub`, `builtin`), the loaded model and its
device and dtype (`loaded`), the bounded cache (`cache`), the feature-level draft head (`head`), tokenizer
translation for drafts with another vocabulary (`translate`) and the built-in draft as an engine loads it
(`export`). Quantised weights are specviz.quant's. Imports native and the lowest layer; never backends, drafters
or the engine.
"""
