"""The one status filter now lives in `caldera.agents.status` (both modes use it: adapter
`status` answers and process mode's status file). This name stays for importers."""
from caldera.agents.status import (FIELDS, HEALTH_WORD, LEVELS, LIST_MAX, NOT_ANSWERING, OPENCLAW_STATUS,  # noqa: F401
                                   STRING_MAX, filter_status, health_word, level_of, not_answering,
                                   openclaw_status)
