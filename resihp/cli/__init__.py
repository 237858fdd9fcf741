"""The `resihp` command line."""
