"""The reconciler's plan (``state.plan``), pure: teardown first and only once the desired
state is synced, one step per volume (attach, then stage, then mount), a device shared by two
pods attached and staged once, uncertain records torn down or done again."""

from __future__ import annotations

from podvisor.services.volumes.apitypes import CSISource
from podvisor.services.volumes.spec import CsiVolume, Plugin, VolumeSpec
from podvisor.services.volumes.state import (
    ActualState,
    Device,
    DeviceRecord,
    Mounted,
    MountKey,
    MountRecord,
    Op,
    device_of,
    plan,
)


def csi_spec(uid: str, pv: str = "pv1", attach: bool = False) -> VolumeSpec:
    src = CSISource("csi.test", f"h-{pv}")
    return VolumeSpec(uid, f"p-{uid}", "default", "data", pv, Plugin.CSI,
                      f"kubernetes.io/csi/csi.test^h-{pv}", csi=CsiVolume(src, attach=attach))


def host_spec(uid: str) -> VolumeSpec:
    return VolumeSpec(uid, f"p-{uid}", "default", "data", "pv-h", Plugin.HOST_PATH,
                      f"kubernetes.io/host-path/{uid}-pv-h", path="/srv")


def ops(steps: list) -> list[tuple[str, str]]:  # type: ignore[type-arg]
    return [(str(s.op), s.key.pod_uid if s.key else s.device.unique_name) for s in steps]


def desired(*specs: VolumeSpec) -> dict[MountKey, VolumeSpec]:
    return {MountKey.of(s): s for s in specs}


def test_a_new_csi_volume_is_staged_then_mounted_then_nothing() -> None:
    spec = csi_spec("a")
    actual = ActualState()
    assert ops(plan(desired(spec), actual, True)) == [("stage", "a")]
    actual.devices[spec.unique_name] = DeviceRecord(device_of(spec), staged=Mounted.YES)
    assert ops(plan(desired(spec), actual, True)) == [("mount", "a")]
    actual.mounts[MountKey.of(spec)] = MountRecord(MountKey.of(spec), device_of(spec),
                                                   Mounted.YES, spec)
    assert plan(desired(spec), actual, True) == []


def test_an_attachable_volume_is_attached_first() -> None:
    spec = csi_spec("a", attach=True)
    actual = ActualState()
    assert ops(plan(desired(spec), actual, True)) == [("attach", "a")]
    actual.devices[spec.unique_name] = DeviceRecord(device_of(spec), attached=True)
    assert ops(plan(desired(spec), actual, True)) == [("stage", "a")]


def test_two_pods_of_one_claim_share_one_stage() -> None:
    a, b = csi_spec("a"), csi_spec("b")
    steps = plan(desired(a, b), ActualState(), True)
    assert [str(s.op) for s in steps] == ["stage"]


def test_teardown_waits_for_the_desired_state_to_sync() -> None:
    spec = csi_spec("a")
    actual = ActualState()
    actual.mounts[MountKey.of(spec)] = MountRecord(MountKey.of(spec), device_of(spec),
                                                   Mounted.YES, spec)
    actual.devices[spec.unique_name] = DeviceRecord(device_of(spec), staged=Mounted.YES)
    assert plan({}, actual, False) == []
    assert ops(plan({}, actual, True)) == [("unmount", "a")]
    del actual.mounts[MountKey.of(spec)]
    assert ops(plan({}, actual, True)) == [("unstage", spec.unique_name)]


def test_a_device_still_mounted_by_another_pod_is_not_unstaged() -> None:
    a, b = csi_spec("a"), csi_spec("b")
    actual = ActualState()
    for s in (a, b):
        actual.mounts[MountKey.of(s)] = MountRecord(MountKey.of(s), device_of(s), Mounted.YES, s)
    actual.devices[a.unique_name] = DeviceRecord(device_of(a), staged=Mounted.YES)
    assert ops(plan(desired(b), actual, True)) == [("unmount", "a")]


def test_reconstructed_uncertain_records_are_done_again_or_torn_down() -> None:
    spec = csi_spec("a")
    key = MountKey.of(spec)
    dev = Device(spec.unique_name, "csi.test", "h-pv1")
    actual = ActualState({key: MountRecord(key, dev, Mounted.UNCERTAIN)},
                         {spec.unique_name: DeviceRecord(dev, staged=Mounted.UNCERTAIN)})
    # still wanted: staged again (idempotent), then published again
    assert ops(plan(desired(spec), actual, True)) == [("stage", "a")]
    # not wanted: unpublished, then (next pass) unstaged
    assert ops(plan({}, actual, True)) == [("unmount", "a")]


def test_detach_after_unstage_when_podvisor_attached_it() -> None:
    dev = Device("kubernetes.io/csi/csi.test^h", "csi.test", "h", "csi-123")
    actual = ActualState(devices={dev.unique_name: DeviceRecord(dev, attached=True)})
    assert [str(s.op) for s in plan({}, actual, True)] == [str(Op.DETACH)]


def test_host_path_volumes_are_only_recorded() -> None:
    spec = host_spec("a")
    assert ops(plan(desired(spec), ActualState(), True)) == [("mount", "a")]
