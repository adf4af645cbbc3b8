"""Recordings: a finished run kept as data (`record`), its file format and JSON Schema (`schema`), and the
self-contained HTML page made from one (`export`). Imports api, view and below.
"""
