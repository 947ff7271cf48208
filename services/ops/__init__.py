"""The ops process: the ops port (``opsAddress``:``opsPort``) for supervisord's users, with the
dashboard at ``/`` and supervisord's XML-RPC (API 3.0) at ``/RPC2`` behind HTTP Basic auth.
Nothing of it is imported by other packages; its entry is ``podvisor.services.ops.main``.

The front door exports nothing: the rest of the package is private."""

__all__: list[str] = []
