"""Tests of modalities."""
