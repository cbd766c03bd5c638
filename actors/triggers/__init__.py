"""The trigger role: executions started by messages on NATS subjects (actors/triggers/actor.py)."""
