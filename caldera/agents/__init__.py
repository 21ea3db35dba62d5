"""The agent drivers (SPEC sections 7 and 7b) and what they share: the manifest, the
settings rules, the blueprint install (`caldera init`), the 30-minute update window,
config revisions, and `caldera check`'s probes. Adapter mode lives in `adapter/`.

May import: protocol, host and the base modules (config, errors, redact). Never
daemon or cli; skills and backends are siblings, not imported.
"""
