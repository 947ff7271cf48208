"""The pod sources (static pod directory, static pod URL): one process each, each owner of its
``pods-<source>`` map.

Other packages read a source's set through its map (``ipc/maps.py``: ``pods_map``,
``PodSetValue``); the front door exports nothing. The processes' entries are
``podvisor.services.sources.file_main`` and ``http_main``."""

__all__: list[str] = []
