"""Adaptation: live fail-slow detection, calibration, and the replans the scheduler policy decides."""
