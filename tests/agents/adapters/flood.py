#!/usr/bin/env python3
"""Floods stdout past any cap."""
import sys

chunk = "x" * 65536
for _ in range(1000):
    sys.stdout.write(chunk)
sys.stdout.flush()
