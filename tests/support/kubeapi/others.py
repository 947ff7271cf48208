"""Other clients of the cluster writing pod statuses, as they do it (the tests' "somebody else
changed it"). They write through ``Store.update`` on the ``status`` subresource with the
object's resourceVersion (an ``UpdateStatus``: a PUT with its optimistic lock), i.e. as
through another API server of the cluster: they work while the stand-in is stopped too.

- ``mark_pods_not_ready``: the node lifecycle controller's ``MarkPodsNotReady``
  (pkg/controller/util/node): every pod of the node with a ``Ready`` condition gets it
  ``False``, ``lastTransitionTime`` now when it changed (``UpdatePodCondition``).
- ``set_condition``: a controller's own condition (a readiness gate's, say), replaced or added.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from tests.support.kubeapi.store import ApiError, Obj, Store, now_rfc3339


def _update_status(store: Store, pod: Obj, change: Callable[[Obj], bool]) -> bool:
    """Change ``pod``'s status (a copy) and write it with its resourceVersion, reading it again
    after a conflict (as client-go's ``RetryOnConflict``); False when ``change`` changed
    nothing (no write)."""
    meta = pod["metadata"]
    for _ in range(5):
        new = copy.deepcopy(pod)
        if not change(new.setdefault("status", {})):
            return False
        try:
            store.update("pods", meta["namespace"], meta["name"], lambda _old, new=new: new,
                         subresource="status")
        except ApiError as exc:
            if exc.code != 409:
                raise
            pod = store.get("pods", meta["namespace"], meta["name"])
            continue
        return True
    raise AssertionError(f"pod {meta['name']}: 5 conflicts in a row")


def mark_pods_not_ready(store: Store, node: str, wall: Callable[[], float]) -> list[str]:
    """Ready=False on every pod of ``node`` that has a Ready condition; the names changed."""
    items, _ = store.list("pods", None)
    changed = []
    for pod in items:
        if pod.get("spec", {}).get("nodeName") != node:
            continue

        def not_ready(status: Obj) -> bool:
            for cond in status.get("conditions") or []:
                if cond.get("type") == "Ready":
                    if cond.get("status") == "False":
                        return False
                    cond["status"] = "False"
                    cond["lastTransitionTime"] = now_rfc3339(wall())
                    return True
            return False

        if _update_status(store, pod, not_ready):
            changed.append(pod["metadata"]["name"])
    return changed


def set_condition(store: Store, ns: str, name: str, condition: dict[str, Any],
                  wall: Callable[[], float]) -> None:
    """Replace or add ``condition`` (by type) on the pod, stamped now."""
    pod = store.get("pods", ns, name)

    def put(status: Obj) -> bool:
        conds = [c for c in status.get("conditions") or [] if c.get("type") != condition["type"]]
        status["conditions"] = [*conds, {"lastProbeTime": None,
                                         "lastTransitionTime": now_rfc3339(wall()),
                                         **condition}]
        return True

    _update_status(store, pod, put)
