#!/usr/bin/env python3
"""Prints a diagnostic line on stdout before the JSON."""
print("loading board cache...")
print('{"state": {"level": "ok"}, "values": {}, "logs": []}')
