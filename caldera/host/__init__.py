"""What the runtime reads from and does to its host: cgroup v2/v1 and /proc figures
(`cgroups`, `sampler`), the one subprocess runner (`proc`), sd_notify, journald-aware
logging setup, atomic files and the state-dir lock (`fsutil`), the durable key-value
state (`statefile`), malloc tuning, and time formatting (`timefmt`: RFC 3339 and
"12 s ago").

May import: the base modules (config, errors, redact) only.
"""
