"""Process mode (SPEC section 7b): the runtime starts, supervises, restarts and reports the
agent's one main process (`ProcessDriver`, driver.py; docs/process.md).

`as_process_driver` is the one name of process mode that code serving every mode imports
(the daemon, `start/stop/restart_openclaw`): it imports nothing of process mode itself.
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
    module = sys.modules.get(DRIVER_MODULE)
    if driver is None or module is None:
        return None
    process_driver: type[ProcessDriver] = module.ProcessDriver
    return driver if isinstance(driver, process_driver) else None
