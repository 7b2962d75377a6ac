"""Mint api routes package."""
