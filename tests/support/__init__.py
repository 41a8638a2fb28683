"""Helpers the tests share that are not fixtures (fixtures live in the nearest common conftest.py); no tests here."""
