"""Protocol v1, the client side (SPEC section 5): the HTTP client, the session and
its single-flight register, the durable outbox, the one retry policy (backoff,
Retry-After, jitter), the payload builders, and the published JSON schemas.

May import: host and the base modules (config, errors, redact). Nothing above.
"""
