"""Mint trainer package."""
