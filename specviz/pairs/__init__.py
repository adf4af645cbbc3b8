"""The pair check: can this draft q serve this target p, and is it worth it? `check` runs it, `measure` times the
acceptance runs, `report` holds the findings, `verdict` says them in sentences.
Imports api, engine, drafters, models and below.
"""
