"""Mint services package."""
