"""The OpenCode backend (SPEC section 10, docs/backends.md "OpenCode").

One `opencode serve` per agent, started on first use on a loopback port with its own
HOME, XDG and temp dirs and a random password, reused by later turns and stopped when
idle (`owner.ServerOwner`); the provider's key never enters OpenCode: the runtime's
loopback forwarder (`backends/forwarder.py`, Claude Code's too) adds it, on OpenCode's
routes (`route.ProviderRoutes`), for the server's life. OpenCode has no sandbox: its
commands run under bubblewrap, or Bash is denied (`confine`, `policy`).

    provider   the projection (secrets/opencode/) or the AI gateway -> ServerSpec, the run's model
    route      ProviderRoutes: the forwarder's route (path token -> provider, placeholders -> secrets)
    server     one `opencode serve` process: start, its HTTP API, its event stream, stop
    owner      ServerOwner: the one server of an agent (get/close, idle stop, restart after death);
               the daemon holds it in registry.BackendServers, made by the agent's first run
    confine    the agent's commands under bubblewrap (OpenCode's SHELL is its wrapper)
    policy     the execution policy as OpenCode permission rules
    mapping    OpenCode's events -> the standard events; errors -> failure kinds
    driver     OpenCodeBackend: the seed-003 contract
"""
