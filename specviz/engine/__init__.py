"""The decode loops and what a run keeps beside them.

`loop`: speculative decoding (draft q proposes, target p verifies) and plain decoding, as numbered steps; `setup`:
what a run needs before its first round; `tally`: the one fold over the event stream; `costs`: what a forward call
costs here; `detail`: the step-through's view of a round. Imports drafters, backends, models and the top-level
modules; nothing above it.
"""
