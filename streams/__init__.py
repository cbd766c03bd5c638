"""JetStream layout (streams, subjects, consumers, buckets) and the embedded server.

Nothing here imports `actors`: the layout is the contract every actor shares.
"""
