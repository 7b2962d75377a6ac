"""Prices, spend under budgets, quotas and usage records."""
