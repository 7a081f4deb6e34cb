"""Prefect flows: they orchestrate DVC stages (when, where, retries); they hold no algorithm."""
