#!/usr/bin/env python3
"""Prints two JSON objects for every JSON verb."""
print('{"state": {"level": "ok"}}')
print('{"state": {"level": "bad"}}')
