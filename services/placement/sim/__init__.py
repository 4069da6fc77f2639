"""Trace-driven simulator of the placement policy."""
