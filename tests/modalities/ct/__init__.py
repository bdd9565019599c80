"""Tests of modalities/ct."""
