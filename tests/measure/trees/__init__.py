"""Tests of measure.trees."""
