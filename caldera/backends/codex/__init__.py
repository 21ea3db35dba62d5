"""The Codex backend (`codex app-server`, JSON-RPC over stdio): `backend` (CodexBackend,
the turn loop), `appserver` (the process and its channel), `config` (the projection and
the private CODEX_HOME), `normalize` (notifications -> standard events), `deltas` (the
agentMessage delta lines checked without being built). See docs/backends.md.

Empty on purpose: the registry names `caldera.backends.codex.backend:CodexBackend`, and
nothing is imported before a Codex run needs it.
"""
