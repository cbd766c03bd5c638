"""Requests any NATS client may send, answered by the engine pods with the public client:
an execution's status and result (`result.request`), registering a playbook
(`catalog.register`), cancelling an execution (`execution.cancel`). The formats are in
docs/protocol/asyncapi.yaml."""
