"""Rules: pure functions from a hardware snapshot to profile decisions.

``engine`` runs them in order (``engine.RULES``) and builds the profile; each other module owns
the rules for one area, citing the rules catalog id of each threshold.
"""
