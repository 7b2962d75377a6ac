"""Mint api package."""
