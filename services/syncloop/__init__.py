"""The sync loop process: owner of the ``desired`` map; drives the runtime through the CRI.
Its entry is ``podvisor.services.syncloop.main`` (RunOnce's: ``runonce_main``).

The front door: how every pod is stopped as the sync loop stops an orphan, for
``podvisorctl shutdown --pods`` when no agent runs and for the agent's count of the pods it
leaves (``owned_pod_uids``, ``pod_cgroups``, ``runtime_pods``, ``stop_all_pods``); where a pod's
cgroup, volumes and logs are (``pod_cgroup_parent``, ``empty_dir_path``, ``pod_log_dir``: the
eviction manager measures them). The rest of the package is private."""

from podvisor.services.syncloop.cri_config import empty_dir_path
from podvisor.services.syncloop.labels import pod_log_dir
from podvisor.services.syncloop.podcgroups import pod_cgroup_parent
from podvisor.services.syncloop.stopall import (
    owned_pod_uids,
    pod_cgroups,
    runtime_pods,
    stop_all_pods,
)

__all__ = ["empty_dir_path", "owned_pod_uids", "pod_cgroup_parent", "pod_cgroups", "pod_log_dir",
           "runtime_pods", "stop_all_pods"]
