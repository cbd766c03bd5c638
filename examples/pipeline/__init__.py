"""The design documents' HTTP-to-Postgres pipeline, runnable: `python -m examples.pipeline`
(examples/pipeline/README.md)."""
