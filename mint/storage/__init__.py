"""Mint storage package."""
