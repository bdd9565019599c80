"""Tests of layout."""
