"""The daemon layer: `caldera run` and `caldera report --once` as running code.

Owns the wiring (`wiring`: what each loop and handler is given), the loops (one
small module each: `heartbeat`, `reporter`, `poller`, `sender`), a command's life
(`life`: its states and steps from `commands/next` to its delivered finish), the lanes
and the executor (a handler under its timeout), command dispatch
(`dispatch`: command type -> handler) and the built-in commands, and the one-shot
report (`report_once`).

May import: agents, skills, backends, protocol, host, and the base modules
(config, errors, redact). Never cli.
"""
