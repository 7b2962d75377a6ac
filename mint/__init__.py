"""Mint: a self-hostable post-training platform for large language models."""

__version__ = "0.1.0"
