"""Adapter mode (seed 000): the runtime drives an agent that keeps its own processes
through its adapter program — invocation, answers, verbs, status filtering, logs,
the health check, the driver the daemon uses, and the control-plane verbs.

May import: caldera.agents' shared modules (manifest, settings, window), protocol,
host and the base modules.
"""
