"""Tinker-compatible primitives: sessions and their models, the worker-side runner, futures, sampling,
checkpoints and their signed URLs, projects, provenance and traces."""
