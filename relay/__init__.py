"""Relay: team memory for coding agents.

Kept import-free on purpose: the recall hook imports `relay.hook`, and anything
imported here would be paid on every prompt.
"""

__version__ = "0.1.0"
