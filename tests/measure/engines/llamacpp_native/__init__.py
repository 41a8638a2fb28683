"""Tests of measure.engines.llamacpp_native."""
