"""The data plane of one device: its process groups, TP collectives, micro-batches and instruction list."""
