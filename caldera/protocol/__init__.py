"""Protocol v1, the client side (SPEC section 5): the HTTP client, the session and
its single-flight register, the durable outbox, the one retry policy (backoff,
Retry-After, jitter), the payload builders, the published JSON schemas, the parsed
command and the command contract its handlers implement (`handlers`).

May import: host and the base modules (config, errors, redact). Nothing above.
"""
