"""The ops process: the ops port (``opsAddress``:``opsPort``) for supervisord's users, with the
dashboard at ``/`` and supervisord's XML-RPC (API 3.0) at ``/RPC2`` behind HTTP Basic auth.
Its entry is ``podvisor.services.ops.main``.

The front door: ``check_auth`` (HTTP Basic, constant time), which the fleet
(``services.fleet``) shares (supervisord's fault codes are the control protocol's ``Fault``,
``ipc/control.py``); the rest of the package is private."""

from podvisor.services.ops.app import check_auth

__all__ = ["check_auth"]
