"""Just enough of Kubernetes' protobuf encoding for the stand-in to read what kubectl sends as
``application/vnd.kubernetes.protobuf`` (its typed clients do): the ``k8s\\x00`` envelope
(``runtime.Unknown``: typeMeta 1, raw 2) and the protobuf wire format, read into field numbers
(generated.proto of k8s.io/api). Only the messages the stand-in needs are mapped:
a CertificateSigningRequest's metadata (name 1, resourceVersion 6) and status.conditions
(type 1, reason 2, message 3, status 6) for ``kubectl certificate approve|deny``."""

from __future__ import annotations

from typing import Any

MAGIC = b"k8s\x00"
PROTOBUF = "application/vnd.kubernetes.protobuf"


def _varint(data: bytes, i: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        b = data[i]
        i += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, i
        shift += 7


def fields(data: bytes) -> dict[int, list[Any]]:
    """Field number -> values (ints for varints, bytes for length-delimited)."""
    out: dict[int, list[Any]] = {}
    i = 0
    while i < len(data):
        key, i = _varint(data, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(data, i)
        elif wire == 2:
            size, i = _varint(data, i)
            value, i = data[i:i + size], i + size
        elif wire == 1:
            value, i = data[i:i + 8], i + 8
        elif wire == 5:
            value, i = data[i:i + 4], i + 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        out.setdefault(number, []).append(value)
    return out


def _text(f: dict[int, list[Any]], n: int) -> str:
    return bytes(f[n][0]).decode() if n in f else ""


def unwrap(body: bytes) -> tuple[str, str, bytes]:
    """(apiVersion, kind, raw message) of an enveloped body."""
    if not body.startswith(MAGIC):
        raise ValueError("not a Kubernetes protobuf body")
    unknown = fields(body[len(MAGIC):])
    type_meta = fields(unknown[1][0]) if 1 in unknown else {}
    return _text(type_meta, 1), _text(type_meta, 2), bytes(unknown.get(2, [b""])[0])


def csr_approval(body: bytes) -> dict[str, Any]:
    """The JSON form of a CertificateSigningRequest's metadata and status conditions."""
    api_version, kind, raw = unwrap(body)
    if kind != "CertificateSigningRequest":
        raise ValueError(f"the stand-in reads no protobuf {kind or 'object'}")
    top = fields(raw)
    meta = fields(top[1][0]) if 1 in top else {}
    status = fields(top[3][0]) if 3 in top else {}
    conditions = []
    for c in status.get(1, []):
        cf = fields(c)
        conditions.append({"type": _text(cf, 1), "status": _text(cf, 6) or "True",
                           "reason": _text(cf, 2), "message": _text(cf, 3)})
    return {"apiVersion": api_version, "kind": kind,
            "metadata": {"name": _text(meta, 1), "resourceVersion": _text(meta, 6)},
            "status": {"conditions": conditions}}
