"""Where guesses come from: one seam (`base`), its siblings (`model`, `lookup`, `head`, `mix`, `translating`)
and the policies that choose how many tokens a round drafts and how large a tree grows (`policies`).
Imports backends, models and the top-level modules; never the engine.
"""
