"""Webhook subscriptions and events, their signed delivery, and the egress policy every delivery obeys."""
