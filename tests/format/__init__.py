"""Tests of format."""
