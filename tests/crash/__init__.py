"""Crash loop for the durable storage: ``python -m tests.crash --iterations N``."""
