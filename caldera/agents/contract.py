"""What every agent driver shares about its agent's answers: `ContractError`.

An adapter's output (adapter mode) and a status file (process mode) are untrusted;
a breach of the contract is this one error, whose message says how. It lives here,
not in `agents/adapter/`, so that the shared modules (`settings`, `manifest`) and
every mode can use it without importing a mode.
"""


class ContractError(ValueError):
    """An answer breaks the agent contract; the message says how."""
