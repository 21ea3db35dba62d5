"""Skills (SPEC section 9): content_md5, the inventory of the skill roots, archive
checks, install/update/remove/disable/quarantine, packaging for upload, the
watcher loop and `caldera skills`. Decisions where SPEC is silent: docs/skills.md.

May import: protocol, host and the base modules.
"""
