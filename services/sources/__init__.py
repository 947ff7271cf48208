"""The pod sources (static pod directory, static pod URL): one process each, each owner of its
``pods-<source>`` map.

The front door: how a source's map reads (``map_name``, ``SET_KEY``). The processes' entries
are ``podvisor.services.sources.file_main`` and ``http_main``."""

from podvisor.services.sources.publish import SET_KEY, map_name

__all__ = ["SET_KEY", "map_name"]
