"""Mint cli package."""
