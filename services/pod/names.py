"""Kubernetes name rules (apimachinery ``validation``): each check returns a reason or None."""

from __future__ import annotations

import re

_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_LABEL = re.compile(rf"^{_LABEL}$")
_DNS1123_SUBDOMAIN = re.compile(rf"^{_LABEL}(\.{_LABEL})*$")
_QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_IANA_SVC_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")


def dns1123_label(name: str) -> str | None:
    """Container, volume and namespace names: at most 63 lowercase alphanumerics or '-'."""
    if len(name) > 63:
        return f"{name!r} must be no more than 63 characters (DNS-1123 label)"
    if not _DNS1123_LABEL.match(name):
        return (f"{name!r} is not a valid DNS-1123 label (lowercase letters, digits and '-', "
                "starting and ending with a letter or digit)")
    return None


def dns1123_subdomain(name: str) -> str | None:
    """Pod names: at most 253 characters, DNS-1123 labels joined by '.'."""
    if len(name) > 253:
        return f"{name!r} must be no more than 253 characters (DNS-1123 subdomain)"
    if not _DNS1123_SUBDOMAIN.match(name):
        return (f"{name!r} is not a valid DNS-1123 subdomain (lowercase letters, digits, '-' "
                "and '.', starting and ending with a letter or digit)")
    return None


def qualified_name(key: str) -> str | None:
    """Label and annotation keys: ``[prefix/]name``, prefix a DNS subdomain, name <= 63."""
    prefix, slash, name = key.rpartition("/")
    if slash and (not prefix or dns1123_subdomain(prefix) is not None):
        return f"{key!r} has an invalid prefix (must be a DNS-1123 subdomain)"
    if not name or len(name) > 63 or not _QUALIFIED_NAME.match(name):
        return (f"{key!r} is not a valid qualified name (at most 63 alphanumerics, '-', '_' "
                "or '.', starting and ending with an alphanumeric, with an optional DNS prefix)")
    return None


def label_value(value: str) -> str | None:
    """Label values: empty, or at most 63 characters like a qualified name."""
    if value and (len(value) > 63 or not _QUALIFIED_NAME.match(value)):
        return f"{value!r} is not a valid label value"
    return None


def port_name(name: str) -> str | None:
    """Named ports (IANA_SVC_NAME): at most 15 characters, at least one letter, no '--'."""
    if (len(name) > 15 or not _IANA_SVC_NAME.match(name) or "--" in name
            or not any(c.isalpha() for c in name)):
        return (f"{name!r} is not a valid port name (at most 15 lowercase alphanumerics or '-', "
                "with at least one letter)")
    return None


def env_var_name(name: str) -> str | None:
    """Environment variable names: printable, not empty, no '=' (Kubernetes >= 1.30 rule)."""
    if not name or "=" in name or not name.isprintable():
        return f"{name!r} is not a valid environment variable name"
    return None
