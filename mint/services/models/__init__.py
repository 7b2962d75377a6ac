"""Adapters and their versions, uploads of adapters trained elsewhere, and garbage collection of
unreferenced objects."""
