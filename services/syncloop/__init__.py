"""The sync loop process: owner of the ``desired`` map; drives the runtime through the CRI.
Nothing of it is imported by other packages; its entry is ``podvisor.services.syncloop.main``.

The front door exports nothing: the rest of the package is private."""

__all__: list[str] = []
