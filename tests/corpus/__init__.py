"""Recorded execution logs (tests/corpus/README.md): `record` writes them, `load` reads
them back."""
