"""Tests of toolkit."""
