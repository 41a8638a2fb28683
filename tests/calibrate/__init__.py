"""Tests of calibrate."""
