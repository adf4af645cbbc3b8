"""Loading models: hub ids, local folders and the built-in pair (`hub`, `builtin`), the loaded model and its
device and dtype (`loaded`), quantised targets (`quant`), the bounded cache (`cache`), the feature-level draft
head (`head`) and tokenizer translation for drafts with another vocabulary (`translate`).
Imports native and the top-level modules; never backends, drafters or the engine.
"""
