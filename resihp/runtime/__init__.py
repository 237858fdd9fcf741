"""The real system: controller, agents, workers, data path and the single-process reference.

Submodules are imported explicitly (`from resihp.runtime.data import ...`); nothing heavy loads here.
"""
