"""The server process: the read-only HTTP port. Nothing of it is imported by other packages;
its entry is ``podvisor.services.server.main``.

The front door exports nothing: the rest of the package is private."""

__all__: list[str] = []
