"""Periodic upkeep across domains: the reconciler that resends work a crashed process left, retention
of old checkpoints and captures, and the platform's health and readiness."""
