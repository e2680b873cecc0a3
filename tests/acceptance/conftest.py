"""Acceptance fixtures: one real cluster for the package (tests/acceptance/cluster.py)."""

from __future__ import annotations

from tests.acceptance.cluster import cluster

__all__ = ["cluster"]
