"""`as_process_driver`: an `AgentDriver` narrowed to process mode's, the one name of process
mode that code serving every mode imports (the daemon, `start/stop/restart_openclaw`). It
imports nothing of process mode at run time: an adapter-mode runtime never loads it.
"""
from __future__ import annotations

import sys

from caldera import TYPE_CHECKING

if TYPE_CHECKING:
    from caldera.agents.driver import AgentDriver
    from caldera.agents.process.driver import ProcessDriver

DRIVER_MODULE = "caldera.agents.process.driver"


def as_process_driver(driver: AgentDriver | None) -> ProcessDriver | None:
    """The driver when it is process mode's, else None. An adapter-mode runtime never
    imports process mode (its start-up and memory budget, docs/performance.md), and no
    ProcessDriver exists before its module is imported: the isinstance is asked only then."""
    if driver is None or DRIVER_MODULE not in sys.modules:
        return None
    from caldera.agents.process.driver import ProcessDriver  # loaded: only the name is looked up

    return driver if isinstance(driver, ProcessDriver) else None
