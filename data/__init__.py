"""Data: collection with a teacher, and traces → one verified chat dataset per role.

``data.build`` turns a run's traces into role datasets (``python -m heart_distill.data.build runs/<name>``),
``data.filters`` names every rule that decides what is kept, ``data.card`` writes the
dataset cards. Nothing here knows about training arguments.
"""

TEACHER_WORDING_VERSION = 2
"""Version of the gold teacher's wording (objectives, requests, feedback it writes), bumped
whenever it changes, so that the pipeline's content-addressed stages collect again instead of
reusing traces in the old wording (1: a plan step's objective leads with the arguments that
tell it from the plan's other calls of its tool; 2: steps of one tool that still read alike
say which of its calls they are, "call 2 of 3"). The roles' input and answer formats have
their own version (:data:`heart.roles.FORMATS_VERSION`), which the whole-loop benchmark's
ledger also keys on: a change of wording alone leaves its chunks valid."""
