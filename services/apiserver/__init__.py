"""podvisor.services.apiserver: what the API-facing processes share (issue 15).

- ``ApiConnection(kubeconfig)``: the official ``kubernetes`` client's configuration (TLS,
  token, client certificate) with raw JSON requests (``request``) and watches (``watch``);
  ``ApiError`` (an HTTP answer) and ``ApiUnreachable`` (none).
- ``ApiMeta.of(obj)``: the typed ``metadata`` of an API object held as JSON.
- ``Reflector``: list + watch of one collection on a thread (bookmarks, 410 relist, back-off).
- ``WakePipe``: how a helper thread wakes a process's poll loop.
- ``WebhookAuthenticator`` / ``WebhookAuthorizer`` (``User``, ``Attributes``, ``Decision``,
  ``ReviewFailed``): TokenReview and SubjectAccessReview for the main port, cached per the
  kubelet's TTLs; see ``webhook.py``.
- ``ObjectWatches``: one watch per referenced ConfigMap/Secret (the kubelet's ``Watch``
  change-detection strategy); see ``objectwatch.py``.
"""

from podvisor.services.apiserver.client import (
    MERGE_PATCH,
    STRATEGIC_MERGE_PATCH,
    ApiConnection,
    ApiError,
    ApiUnreachable,
    Obj,
    WatchStream,
)
from podvisor.services.apiserver.meta import ApiMeta, node_addresses
from podvisor.services.apiserver.objectwatch import (
    NotRegistered,
    NotSynced,
    ObjectKey,
    ObjectWatches,
)
from podvisor.services.apiserver.reflector import Reflector, Sink
from podvisor.services.apiserver.wake import WakePipe
from podvisor.services.apiserver.webhook import (
    Attributes,
    Decision,
    ReviewFailed,
    User,
    WebhookAuthenticator,
    WebhookAuthorizer,
)

__all__ = [
    "MERGE_PATCH",
    "STRATEGIC_MERGE_PATCH",
    "ApiConnection",
    "ApiError",
    "ApiMeta",
    "ApiUnreachable",
    "Attributes",
    "Decision",
    "NotRegistered",
    "NotSynced",
    "Obj",
    "ObjectKey",
    "ObjectWatches",
    "Reflector",
    "ReviewFailed",
    "Sink",
    "User",
    "WakePipe",
    "WatchStream",
    "WebhookAuthenticator",
    "WebhookAuthorizer",
    "node_addresses",
]
