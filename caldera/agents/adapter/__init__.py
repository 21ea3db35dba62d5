"""Adapter mode (seed 000): the runtime drives an agent that keeps its own processes through its adapter program."""
