"""The control plane: the controller, the node agents and the member processes, and what they say."""
