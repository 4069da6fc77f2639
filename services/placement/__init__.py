"""Placement: decides where and when jobs run."""
