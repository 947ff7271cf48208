"""podvisor.services.fleet: one page, one live feed and one XML-RPC endpoint over many nodes
(``podvisor fleet --config FLEET.yaml``; docs/ARCHITECTURE.md, "The fleet"). Not a subsystem:
a program of its own that follows each node's ops port.

The front door: ``main_fleet`` (the CLI's entry); the rest of the package is private."""

from podvisor.services.fleet.main import main_fleet

__all__ = ["main_fleet"]
