"""The teaching views without gradio: `compute` (a round step by step, the pair's numbers), `plots` (their
figures), `lessons` (the guided experiments). Imports engine and below.
"""
