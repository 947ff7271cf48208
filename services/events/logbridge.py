"""The sync loop's log lines that are also events (the kubelet's ``recorder.Eventf`` calls).

The sync loop already logs every step worth an event; ``EventingLog`` wraps its logger, passes
every call through unchanged, and records an event for these (so the pod workers, on their pool
threads, need no publisher):

=============================  =======  ==================  ===================================
log event                      type     reason              message
=============================  =======  ==================  ===================================
syncloop.container.started     Normal   Created, Started    Created/Started container X
syncloop.container.killing     Normal   Killing             Stopping container X
syncloop.container.error       Warning  Failed              <CreateContainerError...>: message
syncloop.container.waiting     Warning  BackOff             Back-off restarting failed
                                                            container X in pod P
                                                            (CrashLoopBackOff; ImagePullBackOff
                                                            is Normal, "Back-off pulling ...")
syncloop.image.pulling         Normal   Pulling             Pulling image "X"
syncloop.image.pulled          Normal   Pulled              Successfully pulled image "X" in
                                                            1.2s (1.3s including waiting)...
syncloop.image.present         Normal   Pulled              Container image "X" already present
                                                            on machine
syncloop.pod.rejected          Warning  <admission reason>  the admission message
syncloop.pod.resize.completed  Normal   ResizeCompleted     Pod resize completed: {"containers":
                                                            [{"name": ..., "resources": ...}]}
syncloop.volume.failed         Warning  FailedMount         MountVolume.SetUp failed for volume
                                                            "V" : <why>
syncloop.work.failed/crashed   Warning  FailedSync          error syncing|terminating pod: ...
syncloop.prestop.failed        Warning  FailedPreStopHook   PreStop hook of container X failed
                                                            (a tcpSocket hook: the kubelet's
                                                            "Cannot run handler: ...")
syncloop.pod.dns               Warning  MissingClusterDNS,  the kubelet's messages (pod DNS)
                                        DNSConfigForming
syncloop.sandbox.config_failed Warning  FailedCreatePodSand Failed to create pod sandbox: <why>
                                        Box
syncloop.sandbox.stop_failed   Warning  FailedKillPod       error killing pod: failed to stop
                                                            sandbox S: <error> (retried)
syncloop.pod.network_not_ready Warning  NetworkNotReady     network is not ready: container
                                                            runtime network not ready: ...
syncloop.runtime.network_*     Warning  NetworkNotReady     (on the Node) the runtime's
                               Normal   NetworkReady        NetworkReady condition changed
syncloop.container.poststart_  Warning  FailedPostStartHook PostStartHook failed (the hook's
failed                                                      output stays in the status, not in
                                                            the event, as the kubelet)
syncloop.pod.failed            <type>   <reason>            the pod failed for good (a FailPod,
                                                            or past activeDeadlineSeconds:
                                                            Normal DeadlineExceeded, Pod was
                                                            active on the node longer than the
                                                            specified deadline)
syncloop.pod.pull_secrets_     Warning  FailedToRetrieve-   Unable to retrieve some image pull
missing                                 ImagePullSecret     secrets (a, b); attempting to pull
                                                            the image may not succeed.
syncloop.pod.update_refused    Warning  <reason>            the refusal (the pod runs on as it
                                                            was)
=============================  =======  ==================  ===================================
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from podvisor.services.events import model as ev
from podvisor.services.events.recorder import Recorder

Found = tuple[str, str, str]  # type, reason, message


def _pod_obj(fields: Mapping[str, Any], container: str = "") -> dict[str, Any]:
    name, _, namespace = str(fields.get("pod", "")).partition("_")
    obj: dict[str, Any] = {"kind": "Pod", "uid": str(fields.get("pod_uid", ""))}
    if name:
        obj["name"], obj["namespace"] = name, namespace
    if container:
        obj["fieldPath"] = f"spec.containers{{{container}}}"
    return obj


def _node_obj(fields: Mapping[str, Any]) -> dict[str, Any]:
    return {"kind": "Node", "name": str(fields.get("node", ""))}


def events_for(event: str, fields: Mapping[str, Any]) -> list[Found]:
    """The events one log line stands for (usually none)."""
    c = str(fields.get("container", ""))
    if event == "syncloop.container.started":
        return [(ev.NORMAL, "Created", f"Created container {c}"),
                (ev.NORMAL, "Started", f"Started container {c}")]
    if event == "syncloop.container.killing":
        return [(ev.NORMAL, "Killing", f"Stopping container {c}")]
    if event == "syncloop.container.error":
        return [(ev.WARNING, "Failed", f"{fields.get('reason', '')}: {fields.get('message', '')}")]
    if event == "syncloop.container.waiting":
        if fields.get("reason") == "CrashLoopBackOff":
            pod = str(fields.get("pod", "")).replace("_", " in namespace ", 1)
            return [(ev.WARNING, "BackOff", f"Back-off restarting failed container {c} in pod "
                                            f"{pod}")]
        if fields.get("reason") == "ImagePullBackOff":
            return [(ev.NORMAL, "BackOff", str(fields.get("message", "Back-off pulling image")))]
        return []
    if event == "syncloop.image.pulling":
        return [(ev.NORMAL, "Pulling", str(fields.get("message", "")))]
    if event in ("syncloop.image.pulled", "syncloop.image.present"):
        return [(ev.NORMAL, "Pulled", str(fields.get("message", "")))]
    if event == "syncloop.container.poststart_failed":
        return [(ev.WARNING, "FailedPostStartHook", "PostStartHook failed")]
    if event == "syncloop.pod.failed":
        kind = ev.NORMAL if fields.get("event_type") == ev.NORMAL else ev.WARNING
        return [(kind, str(fields.get("reason") or "Failed"), str(fields.get("message", "")))]
    if event == "syncloop.pod.pull_secrets_missing":
        return [(ev.WARNING, "FailedToRetrieveImagePullSecret", str(fields.get("message", "")))]
    if event == "syncloop.pod.update_refused":
        return [(ev.WARNING, str(fields.get("reason") or "UnsupportedPodUpdate"),
                 str(fields.get("message", "")))]
    if event == "syncloop.pod.resize.completed":
        return [(ev.NORMAL, "ResizeCompleted", str(fields.get("message", "")))]
    if event == "syncloop.pod.rejected":
        return [(ev.WARNING, str(fields.get("reason") or "Rejected"),
                 str(fields.get("message", "")))]
    if event == "syncloop.volume.failed":
        return [(ev.WARNING, "FailedMount", str(fields.get("message", "")))]
    if event in ("syncloop.work.failed", "syncloop.work.crashed"):
        kind = "terminating" if "terminat" in str(fields.get("kind", "")).lower() else "syncing"
        return [(ev.WARNING, "FailedSync",
                 f"error {kind} pod: {fields.get('error', 'see the syncloop log')}")]
    if event == "syncloop.sandbox.stop_failed":
        return [(ev.WARNING, "FailedKillPod",
                 f"error killing pod: failed to stop sandbox {fields.get('sandbox_id', '')}: "
                 f"{fields.get('error', '')} (retried in {fields.get('retry_in', '?')}s)")]
    if event in ("syncloop.pod.network_not_ready", "syncloop.runtime.network_not_ready"):
        return [(ev.WARNING, "NetworkNotReady", str(fields.get("message", "")))]
    if event == "syncloop.runtime.network_ready":
        return [(ev.NORMAL, "NetworkReady", str(fields.get("message", "")))]
    if event == "syncloop.pod.dns":  # MissingClusterDNS, DNSConfigForming
        return [(ev.WARNING, str(fields.get("reason", "")), str(fields.get("message", "")))]
    if event == "syncloop.sandbox.config_failed":
        return [(ev.WARNING, "FailedCreatePodSandBox", str(fields.get("message", "")))]
    if event == "syncloop.prestop.failed":
        if fields.get("message"):  # the kubelet's handler runner's message
            return [(ev.WARNING, "FailedPreStopHook", str(fields["message"]))]
        detail = fields.get("error") or f"exit code {fields.get('exit_code')}"
        return [(ev.WARNING, "FailedPreStopHook", f"PreStop hook of container {c} failed: "
                                                  f"{detail}")]
    return []


class EventingLog:
    """A logger (the ``EventLog`` protocol) that also records the events above."""

    def __init__(self, log: Any, recorder: Recorder) -> None:
        self._log = log
        self._recorder = recorder

    def _also(self, event: str, fields: Mapping[str, Any]) -> None:
        for type_, reason, message in events_for(event, fields):
            obj = (_node_obj(fields) if event.startswith("syncloop.runtime.")
                   else _pod_obj(fields, str(fields.get("container", ""))))
            self._recorder.record(type_, reason, message, obj)

    def debug(self, event: str, **fields: Any) -> None:
        self._log.debug(event, **fields)

    def info(self, event: str, **fields: Any) -> None:
        self._log.info(event, **fields)
        self._also(event, fields)

    def warning(self, event: str, **fields: Any) -> None:
        self._log.warning(event, **fields)
        self._also(event, fields)

    def error(self, event: str, **fields: Any) -> None:
        self._log.error(event, **fields)
        self._also(event, fields)

    def exception(self, event: str, **fields: Any) -> None:
        self._log.exception(event, **fields)
        self._also(event, fields)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._log, name)
