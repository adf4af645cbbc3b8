"""The tools that make the built-in draft and head: the prompt set, the target's teacher replies and soft labels,
training and evaluation. Each tool runs as a module from a checkout (its docstring says how; --help lists the
options):

    python -m specviz.training.build_prompts      # the prompt set (templates, real texts, the target's own prompts)
    python -m specviz.training.filter_prompts     # a batch of hand-written prompts: the one-of-a-kind ones kept
    python -m specviz.training.make_teacher_data  # the target's greedy replies to them (resumable)
    python -m specviz.training.label_teacher      # soft labels and features on those replies
    python -m specviz.training.train_draft        # the draft model
    python -m specviz.training.train_head         # the feature-level head
    python -m specviz.training.draft_rows         # the draft's or head's output rows cut to those it proposes
    python -m specviz.training.eval_draft         # held-out acceptance of a draft or head
    python -m specviz.training.lookup_stats       # prompt lookup's guesses against the draft's

For these tools and the tests only: no module outside this package imports it, so the app never loads it
(tests/test_layout.py checks that).
"""
