"""PLEG: the pod lifecycle event generator process (relist + the runtime's event stream), owner
of the ``pleg`` map.

The front door: ``EventWatcher`` (the CRI event stream reader the sync loop also uses). The
process's entry is ``podvisor.services.pleg.main``."""

from podvisor.services.pleg.stream import EventWatcher

__all__ = ["EventWatcher"]
