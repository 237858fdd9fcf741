"""resihp: resilient hybrid-parallel LLM training (Detector, Scheduler, Runtime, Simulator)."""

__version__ = "0.1.0"
