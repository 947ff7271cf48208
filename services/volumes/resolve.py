"""The desired state of the world's populator: a pod's mounted volumes resolved through the
API server (the kubelet's ``desiredStateOfWorldPopulator``: ``getPVCExtractPV``,
``getPVSpec``, its checks and messages).

- ``persistentVolumeClaim``: the claim must exist, not be being deleted, be ``Bound`` with a
  ``spec.volumeName``; the PV must point back at it (``spec.claimRef.uid``).
- ``ephemeral``: the claim ``<pod>-<volume>``, which must be controlled by the pod (the
  API server's ephemeral-volume controller made it); then as a claim.
- inline ``csi``: the CSIDriver must allow the ``Ephemeral`` lifecycle mode; its handle is
  ``csi-<sha256(pod UID + volume)>``.
A PV is mounted from ``hostPath`` (used in place), ``local`` (bound into the pod's folder;
its ``nodeAffinity`` must match this Node) or ``csi``; any other source fails the volume.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from podvisor.services.pod import (
    ClaimVolume,
    CSIVolume,
    EphemeralVolume,
    FlexVolume,
    FSGroupChangePolicy,
    ISCSIVolume,
    NFSVolume,
    PluginVolume,
    Pod,
)
from podvisor.services.volumes.apitypes import (
    Claim,
    CSISource,
    Driver,
    Volume,
    affinity_matches,
    dig,
)
from podvisor.services.volumes.spec import (
    NET_PLUGINS,
    CsiVolume,
    Failure,
    Plugin,
    PodWants,
    VolumeSpec,
    volume_handle,
)

STORAGE = "/apis/storage.k8s.io/v1"


class ApiReader(Protocol):
    def get(self, path: str) -> Mapping[str, Any] | None:
        """The object at ``path``; None when it does not exist (404). Raises OSError when the
        server cannot answer."""
        ...


class VolumeError(Exception):
    """Why a volume cannot be resolved (the kubelet's wording)."""


def driver_info(api: ApiReader, name: str) -> Driver:
    return Driver.of(name, api.get(f"{STORAGE}/csidrivers/{name}"))


class Resolver:
    """Resolves pods' volumes for node ``node`` (its labels read once per pass)."""

    def __init__(self, api: ApiReader | None, node: str) -> None:
        self._api = api
        self.node = node
        self._labels: Mapping[str, str] | None = None

    @property
    def api(self) -> ApiReader:
        """The API server; without one (no ``kubeconfig``) only the volumes that name no API
        object resolve (nfs, iscsi, fc, flexVolume: static pods' too)."""
        if self._api is None:
            raise VolumeError("no API server (kubeconfig) to read the volume's objects from")
        return self._api

    def new_pass(self) -> None:
        """Forget the Node's labels: the next pass reads them again."""
        self._labels = None

    def node_labels(self) -> Mapping[str, str]:
        if self._labels is None:
            labels = dig(self.api.get(f"/api/v1/nodes/{self.node}"), "metadata", "labels")
            self._labels = {str(k): str(v) for k, v in labels.items()} \
                if isinstance(labels, Mapping) else {}
        return self._labels

    def pod(self, pod: Pod) -> PodWants:
        specs: list[VolumeSpec] = []
        failures: list[Failure] = []
        for v in pod.spec.volumes:
            if not v.mounted:
                continue
            try:
                specs.append(self._volume(pod, v.name, v.source))
            except VolumeError as err:
                failures.append(Failure(v.name, str(err)))
            except OSError as err:
                failures.append(Failure(v.name, f"error processing volume {v.name!r}: {err}"))
        return PodWants(pod.uid, pod.name, pod.namespace, tuple(specs), tuple(failures))

    def _volume(self, pod: Pod, name: str, source: object) -> VolumeSpec:
        psc = pod.spec.security_context
        base = dict(pod_uid=pod.uid, pod_name=pod.name, pod_namespace=pod.namespace,
                    volume=name, fs_group=psc.fs_group if psc is not None else None,
                    on_root_mismatch=psc is not None and psc.fs_group_change_policy
                    is FSGroupChangePolicy.ON_ROOT_MISMATCH,
                    service_account=pod.spec.service_account_name or "default")
        if isinstance(source, CSIVolume):
            return self._inline(pod, name, source, base)
        if isinstance(source, PluginVolume):
            return plugin_spec(source, base, name, source.read_only, pod.namespace)
        if isinstance(source, EphemeralVolume):
            claim_name, read_only = f"{pod.name}-{name}", False
        elif isinstance(source, ClaimVolume):
            claim_name, read_only = source.claim_name, source.read_only
        else:
            raise VolumeError(f"volume {name!r} is not one the volume manager mounts")
        claim = self._claim(pod, claim_name, ephemeral=isinstance(source, EphemeralVolume))
        pv = self._pv(pod, claim)
        return self._from_pv(pv, claim_name, read_only, base)

    def _claim(self, pod: Pod, claim_name: str, *, ephemeral: bool) -> Claim:
        where = f"{pod.namespace}/{claim_name}"
        raw = self.api.get(f"/api/v1/namespaces/{pod.namespace}/persistentvolumeclaims/"
                           f"{claim_name}")
        if raw is None:
            raise VolumeError(f'error processing PVC {where}: persistentvolumeclaim '
                              f'"{claim_name}" not found')
        claim = Claim.of(raw)
        if ephemeral and not claim.controlled_by(pod.uid):
            raise VolumeError(f"PVC {where} was not created for pod "
                              f"{pod.namespace}/{pod.name} (pod is not owner)")
        if claim.meta.deletion_timestamp:
            raise VolumeError(f"error processing PVC {where}: can't start pod because PVC is "
                              "being deleted")
        if claim.phase != "Bound" or not claim.volume_name:
            raise VolumeError(f"error processing PVC {where}: PVC is not bound (phase "
                              f'"{claim.phase}", volumeName "{claim.volume_name}")')
        return claim

    def _pv(self, pod: Pod, claim: Claim) -> Volume:
        name = claim.volume_name
        raw = self.api.get(f"/api/v1/persistentvolumes/{name}")
        if raw is None:
            raise VolumeError(f'error processing PVC {pod.namespace}/{claim.meta.name}: '
                              f'persistentvolume "{name}" not found')
        pv = Volume.of(raw)
        if not pv.bound:
            raise VolumeError(f'found PV object "{name}" but it has a nil pv.Spec.ClaimRef '
                              "indicating it is not yet bound to the claim")
        if pv.claim_uid != claim.meta.uid:
            raise VolumeError(f'found PV object "{name}" but its pv.Spec.ClaimRef.UID '
                              f'("{pv.claim_uid}") does not point to claim.UID '
                              f'("{claim.meta.uid}")')
        return pv

    def _from_pv(self, pv: Volume, claim: str, read_only: bool,
                 base: dict[str, Any]) -> VolumeSpec:
        name = pv.meta.name
        if pv.kind == "hostPath":
            return VolumeSpec(**base, spec_name=name, plugin=Plugin.HOST_PATH,
                              unique_name=f"{Plugin.HOST_PATH}/{base['pod_uid']}-{name}",
                              read_only=read_only, claim=claim, path=pv.path)
        if pv.kind == "local":
            if pv.affinity is not None and not affinity_matches(pv.affinity, self.node,
                                                                self.node_labels()):
                raise VolumeError(f'local PersistentVolume "{name}" is not on this node: its '
                                  f'nodeAffinity does not match node "{self.node}"')
            return VolumeSpec(**base, spec_name=name, plugin=Plugin.LOCAL,
                              unique_name=f"{Plugin.LOCAL}/{name}", read_only=read_only,
                              claim=claim, path=pv.path)
        if pv.source is not None:
            return plugin_spec(pv.source, base, name, read_only, pv.secret_namespace
                               or base["pod_namespace"], claim, pv.mount_options)
        if pv.kind == "csi" and pv.csi is not None:
            driver = driver_info(self.api, pv.csi.driver)
            if "Persistent" not in driver.lifecycle_modes:
                raise VolumeError(f'volume mode "Persistent" not supported by driver '
                                  f"{driver.name} (only supports {list(driver.lifecycle_modes)})")
            csi = CsiVolume(pv.csi, pv.access_modes[0] if pv.access_modes else "ReadWriteOnce",
                            attach=driver.attach_required, pod_info=driver.pod_info_on_mount,
                            fs_group_policy=driver.fs_group_policy)
            return VolumeSpec(**base, spec_name=name, plugin=Plugin.CSI,
                              unique_name=f"{Plugin.CSI}/{pv.csi.driver}^{pv.csi.handle}",
                              read_only=read_only or pv.csi.read_only, claim=claim, csi=csi)
        raise VolumeError(f'PersistentVolume "{name}": its {pv.kind or "unknown"} source is not '
                          "supported (podvisor mounts hostPath, local, csi, nfs, iscsi, fc and "
                          "flexVolume volumes)")

    def _inline(self, pod: Pod, name: str, source: CSIVolume,
                base: dict[str, Any]) -> VolumeSpec:
        driver = driver_info(self.api, source.driver)
        if not driver.found:
            raise VolumeError(f'CSIDriver "{source.driver}" not found: an inline csi volume '
                              "needs one that allows the Ephemeral lifecycle mode")
        if "Ephemeral" not in driver.lifecycle_modes:
            raise VolumeError(f'volume mode "Ephemeral" not supported by driver {driver.name} '
                              f"(only supports {list(driver.lifecycle_modes)})")
        secret = (pod.namespace, source.node_publish_secret) if source.node_publish_secret \
            else None
        src = CSISource(source.driver, volume_handle(pod.uid, name), source.fs_type,
                        source.read_only, dict(source.volume_attributes), None, secret)
        csi = CsiVolume(src, ephemeral=True, pod_info=driver.pod_info_on_mount,
                        fs_group_policy=driver.fs_group_policy)
        return VolumeSpec(**base, spec_name=name, plugin=Plugin.CSI,
                          unique_name=f"{Plugin.CSI}/{pod.uid}-{name}",
                          read_only=source.read_only, csi=csi)


_PLUGINS = {NFSVolume: Plugin.NFS, ISCSIVolume: Plugin.ISCSI, FlexVolume: Plugin.FLEX}


def plugin_spec(source: PluginVolume, base: Mapping[str, Any], spec_name: str, read_only: bool,
                secret_namespace: str, claim: str = "",
                mount_options: tuple[str, ...] = ()) -> VolumeSpec:
    """An nfs, iscsi, fc or flexVolume volume (inline, or a PV's: ``spec_name`` the PV's
    name). Unique names as the kubelet's for plugins that attach nothing:
    ``<plugin>/<pod uid>-<spec name>`` (``flexvolume-<driver>/...`` for a FlexVolume)."""
    plugin = _PLUGINS.get(type(source), Plugin.FC)
    driver = source.driver if isinstance(source, FlexVolume) else ""
    prefix = f"flexvolume-{driver}" if driver else str(plugin)
    secret_name = source.secret_ref if isinstance(source, FlexVolume | ISCSIVolume) else ""
    assert plugin in NET_PLUGINS or plugin is Plugin.FLEX
    return VolumeSpec(**base, spec_name=spec_name, plugin=plugin,
                      unique_name=f"{prefix}/{base['pod_uid']}-{spec_name}",
                      read_only=read_only, claim=claim, source=source, driver=driver,
                      mount_options=mount_options,
                      secret=(secret_namespace, secret_name) if secret_name else None)
