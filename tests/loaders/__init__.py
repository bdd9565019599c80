"""Tests of loaders."""
