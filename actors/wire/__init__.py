"""Messages on the wire: typed msgspec Structs, the events in the log, their encoding and limits."""
