"""Tests of measure.head."""
