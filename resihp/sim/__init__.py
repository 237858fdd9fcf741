"""Simulation: the DAG evaluation of a Program (pipeline) and the job over time (job)."""
