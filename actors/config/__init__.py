"""A pod's and a client's configuration: every setting, read once from the environment
and flags, then passed down (nothing below reads the environment itself)."""
