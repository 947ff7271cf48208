"""The status process: owner of the ``statuses`` map (pod statuses, persisted under
``state/statuses/``). Nothing of it is imported by other packages; its entry is
``podvisor.services.status.main``.

The front door exports nothing: the rest of the package is private."""

__all__: list[str] = []
