"""The tools that make the built-in draft and head: the prompt set, the target's teacher replies and soft labels,
training and evaluation (`python scripts/build_prompts.py`, `make_teacher_data.py`, `label_teacher.py`,
`train_draft.py`, `train_head.py`, `eval_draft.py`, `lookup_stats.py`: thin entry points into these modules).

For the scripts and the tests only: no module outside this package imports it, so the app never loads it
(tests/test_layout.py checks that).
"""
