"""Tests of modalities/perturbation."""
