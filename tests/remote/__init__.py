"""Tests of remote."""
