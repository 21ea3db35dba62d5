"""The embedded reference control plane: protocol v1 as ClawManager's server speaks it (SPEC section 12).

`server.PlaneServer` serves it on a thread, `store.Store` keeps it in sqlite,
`api` holds the endpoint handlers, `page`/`agent_page` the status pages (charts from
`history` via `charts`), `caldera.cli.plane` the `caldera plane` verbs. docs/plane.md is the reference.

May import: protocol (schemas), host and the base modules; it is a separate server, and the runtime never imports it.
"""
