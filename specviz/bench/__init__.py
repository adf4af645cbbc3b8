"""The benchmark (`python -m specviz bench`): `inputs` (prompt sets and the grid), `measure` (the interleaved timed
runs), `peers` (transformers' own generate), `summary` (the table), `plots` (the figures), `cli` (the subcommand and
its result files) and `machine` (the description stored beside every figure: CPU, vector units, threads, versions).
Imports api, engine and below.
"""
