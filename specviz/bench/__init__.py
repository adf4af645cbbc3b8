"""The benchmark (`python -m specviz bench`): `inputs` (prompt sets and the grid), `measure` (the interleaved timed
runs), `peers` (transformers' own generate), `summary` (the table), `plots` (the figures), `cli` (the subcommand).
Imports api, engine and below.
"""
