"""Code-agent backends (SPEC section 10): the seed-003 adapter contract, the Codex
app-server backend, event normalisation, failure kinds, `agent_run`/`agent_interrupt`
and `caldera turn`/`caldera backends`. See docs/backends.md.

Public entry points for the rest of the runtime:
    caldera.backends.registry.capabilities(env) -> list[str]  (for register.capabilities)
    caldera.backends.registry.ActiveRuns                      (the runs going on now)
    caldera.backends.commands.agent_run / agent_interrupt     (command handlers)

May import: protocol, host and the base modules.
"""
