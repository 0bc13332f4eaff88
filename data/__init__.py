"""Data: collection with a teacher, and traces → one verified chat dataset per role.

``data.build`` turns a run's traces into role datasets (``python -m heart_distill.data.build runs/<name>``),
``data.filters`` names every rule that decides what is kept, ``data.card`` writes the
dataset cards. Nothing here knows about training arguments.
"""
