"""caldera: the host runtime that connects agents to their control plane."""

__version__ = "0.2.0"

# typing.TYPE_CHECKING without importing typing: the quick verbs (`caldera pause`, `status`)
# load many of caldera's modules, and importing typing would add to every start
# (docs/performance.md, section 1). Type checkers take any name TYPE_CHECKING as true, so a
# module writes `from caldera import TYPE_CHECKING` and puts its type-only imports under it.
TYPE_CHECKING = False
