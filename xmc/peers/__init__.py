"""Peers run inside the same pipeline for side-by-side comparison."""
