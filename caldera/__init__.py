"""caldera: the host runtime that connects agents to their control plane."""

__version__ = "0.1.0"
