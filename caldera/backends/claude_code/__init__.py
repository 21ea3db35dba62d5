"""The Claude Code backend (`claude -p`, stream-json over stdio): `backend`
(ClaudeCodeBackend, the turn loop), `config` (the projection, the policy mapping, the
settings and argv), `forwarder` (the run's loopback forwarder, the only holder of the
credential), `normalize` (stream-json -> standard events, failure kinds). See
docs/backends.md.

Empty on purpose: nothing is imported before a Claude Code run needs it.
"""
