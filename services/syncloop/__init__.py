"""The sync loop process: owner of the ``desired`` map; drives the runtime through the CRI.
Its entry is ``podvisor.services.syncloop.main`` (RunOnce's: ``runonce_main``).

The front door: how every pod is stopped as the sync loop stops an orphan, for
``podvisorctl shutdown --pods`` when no agent runs and for the agent's count of the pods it
leaves (``owned_pod_uids``, ``pod_cgroups``, ``runtime_pods``, ``stop_all_pods``). The rest of
the package is private."""

from podvisor.services.syncloop.stopall import (
    owned_pod_uids,
    pod_cgroups,
    runtime_pods,
    stop_all_pods,
)

__all__ = ["owned_pod_uids", "pod_cgroups", "runtime_pods", "stop_all_pods"]
