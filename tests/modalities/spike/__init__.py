"""Tests of modalities/spike."""
