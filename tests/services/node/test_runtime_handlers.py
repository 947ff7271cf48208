"""The Node's ``status.runtimeHandlers`` (the kubelet's ``RuntimeHandlers`` setter): the handlers
of the runtime's CRI Status with both features, read from a real embedded runtime; left out when
the runtime lists none (containerd 1.6); kept as last listed while the runtime is down."""

from __future__ import annotations

from podvisor.services.node.main import runtime_probe
from podvisor.services.node.status import (
    RuntimeFacts,
    RuntimeHandlerFacts,
    keep_handlers,
    node_status,
)
from podvisor.services.runtime.engine import mount_setattr_works
from tests.services.conftest import EmbeddedRuntime
from tests.services.node.test_node_settings import FACTS


def status(runtime: RuntimeFacts) -> dict[str, object]:
    return node_status("n", FACTS, runtime, max_pods=10, port=1, kubelet_version="v")


def test_the_embedded_runtimes_handlers_on_the_node(embedded_runtime: EmbeddedRuntime) -> None:
    facts = runtime_probe(f"unix://{embedded_runtime.socket}")
    assert facts.version.startswith("podvisor-embedded://") and not facts.not_ready
    rro = mount_setattr_works()
    assert status(facts)["runtimeHandlers"] == [
        {"name": name, "features": {"recursiveReadOnlyMounts": rro, "userNamespaces": False}}
        for name in ("", "podvisor")]
    # the runtime gone: the Node says it is down and keeps the handlers last listed
    embedded_runtime.stop()
    down = runtime_probe(f"unix://{embedded_runtime.socket}")
    assert down.not_ready.startswith("container runtime is down") and down.handlers == ()
    kept = keep_handlers(down, facts.handlers)
    assert kept.handlers == facts.handlers and kept.not_ready == down.not_ready
    assert status(kept)["runtimeHandlers"] == status(facts)["runtimeHandlers"]


def test_no_handlers_listed_no_field_and_an_answer_replaces_the_last() -> None:
    assert "runtimeHandlers" not in status(RuntimeFacts("containerd://1.6.20", ""))
    old = (RuntimeHandlerFacts("runc", True),)
    now = RuntimeFacts("r://2", "", handlers=(RuntimeHandlerFacts("", False, True),))
    assert keep_handlers(now, old) == now
    assert status(now)["runtimeHandlers"] == [
        {"name": "", "features": {"recursiveReadOnlyMounts": False, "userNamespaces": True}}]
