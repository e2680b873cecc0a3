"""Fuzz suites: hostile requests against real processes (issue 15)."""
