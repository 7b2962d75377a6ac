"""Mint worker package."""
