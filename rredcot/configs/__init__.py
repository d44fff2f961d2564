"""Bundled YAML configs (package data)."""
