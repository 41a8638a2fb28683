"""Tests of measure.engines."""
