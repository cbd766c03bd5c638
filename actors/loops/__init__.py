"""The counter actor: loop iterations as independent messages, counted."""
