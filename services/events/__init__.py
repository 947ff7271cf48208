"""Kubernetes-style events: built by the processes (``Recorder``, sent by ``EventPublisher``;
``EventingLog`` turns chosen log events into events), kept by the supervisor
(``podvisor.supervisor.eventstore``), listed by ``podvisorctl events``. See
docs/ARCHITECTURE.md, "Events and logs".

The front door: other packages import these names from ``podvisor.services.events`` only."""

from podvisor.services.events.logbridge import EventingLog
from podvisor.services.events.model import (
    DUPLICATE_POD_NAME,
    FAILED_FETCH,
    FAILED_PARSE,
    FAILED_READ,
    FAILED_VALIDATION,
    FILE_TOO_LARGE,
    NORMAL,
    REFERENCES_API_OBJECT,
    UNSUPPORTED_FIELD,
    WARNING,
    WRONG_KIND,
    container_died,
    manifest_error_reason,
    manifest_object,
    new_event,
    pod_object,
)
from podvisor.services.events.publisher import EventPublisher
from podvisor.services.events.recorder import Recorder

__all__ = [
    "DUPLICATE_POD_NAME",
    "FAILED_FETCH",
    "FAILED_PARSE",
    "FAILED_READ",
    "FAILED_VALIDATION",
    "FILE_TOO_LARGE",
    "NORMAL",
    "REFERENCES_API_OBJECT",
    "UNSUPPORTED_FIELD",
    "WARNING",
    "WRONG_KIND",
    "EventPublisher",
    "EventingLog",
    "Recorder",
    "container_died",
    "manifest_error_reason",
    "manifest_object",
    "new_event",
    "pod_object",
]
