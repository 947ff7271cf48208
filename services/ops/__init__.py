"""The ops process: the ops port (``opsAddress``:``opsPort``) for supervisord's users, with the
dashboard at ``/`` and supervisord's XML-RPC (API 3.0) at ``/RPC2`` behind HTTP Basic auth.
Its entry is ``podvisor.services.ops.main``.

The front door: ``check_auth`` (HTTP Basic, constant time) and ``Fault`` (supervisord's fault
codes), which the fleet (``services.fleet``) shares; the rest of the package is private."""

from podvisor.services.ops.app import check_auth
from podvisor.services.ops.states import Fault

__all__ = ["Fault", "check_auth"]
