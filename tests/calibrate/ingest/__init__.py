"""Tests of calibrate.ingest."""
