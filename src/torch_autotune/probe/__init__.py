"""The probe: measure on this machine what the rules can only guess.

``search`` finds the largest batch that trains from a ``fits(batch_size)`` predicate (no torch);
``oom`` tells out-of-memory from real errors; ``timing`` measures with an injected clock;
``workloads`` holds the built-in models and loads the user's; ``trials`` runs real training
steps; ``loader`` measures DataLoader workers.
"""
