"""What the actors keep in NATS key-value and object stores: playbooks, big values, records."""
