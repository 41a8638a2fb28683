"""Tests of measure (its subpackages engines and head in folders of their own)."""
