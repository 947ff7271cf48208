"""The CRI label and annotation keys podvisor puts on sandboxes and containers (the kubelet's
names). The one definition: the sync loop writes them, PLEG, the embedded runtime's index and
``podvisorctl`` read them."""

from __future__ import annotations

POD_UID = "io.kubernetes.pod.uid"
POD_NAME = "io.kubernetes.pod.name"
POD_NAMESPACE = "io.kubernetes.pod.namespace"
CONTAINER_NAME = "io.kubernetes.container.name"
CONTAINER_HASH = "io.kubernetes.container.hash"
RESTART_COUNT = "io.kubernetes.container.restartCount"
GRACE_PERIOD = "io.kubernetes.pod.terminationGracePeriod"
# The container's preStop handler as JSON (the kubelet's annotation), so a container whose pod
# spec is gone (an orphan; `podvisorctl shutdown --pods` without an agent) still gets its hook.
PRE_STOP = "io.kubernetes.container.preStopHandler"
# The container's ports as JSON (the kubelet's annotation): an orphan's httpGet preStop hook
# finds its named port there.
CONTAINER_PORTS = "io.kubernetes.container.ports"
# The container's terminationMessagePath and terminationMessagePolicy (the kubelet's
# annotations): PLEG reads the message of an exited container from them.
TERMINATION_MESSAGE_PATH = "io.kubernetes.container.terminationMessagePath"
TERMINATION_MESSAGE_POLICY = "io.kubernetes.container.terminationMessagePolicy"
