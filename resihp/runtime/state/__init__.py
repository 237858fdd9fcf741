"""Training state across Plan changes: the transfer planner and executor, peer snapshots, checkpoints."""
