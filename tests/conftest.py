"""Shared by both tiers; each tier's own fixtures live in its conftest."""
