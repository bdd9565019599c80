"""Tests of pipeline."""
