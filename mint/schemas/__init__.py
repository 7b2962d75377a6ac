"""Mint schemas package."""
