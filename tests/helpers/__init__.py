"""Reusable test helpers (temp git repositories, ...)."""
