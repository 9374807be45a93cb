"""Names of a service's children, valid for any DLLMService name.

A DLLMService name is a DNS subdomain (up to 253 characters, dots allowed); a Service or Deployment name
must be an RFC 1035 label (63 characters, no dots) and a label value at most 63 characters. A name that
already fits is used as it is; one that does not is cleaned, cut and suffixed with a hash of the whole
original, so two services never share a child.
"""

from __future__ import annotations

import hashlib
import re

_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
BASE_LIMIT = 40  # room for "-" + the longest component or "-profile-" + an 8-character hash


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def dns_label(text: str, limit: int = 63) -> str:
    """``text`` when it is an RFC 1035 label of at most ``limit`` characters, else a cleaned, shortened
    label ending in a hash of ``text``."""
    if len(text) <= limit and _LABEL.match(text):
        return text
    cleaned = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    if cleaned and not cleaned[0].isalpha():
        cleaned = f"x-{cleaned}"
    head = cleaned[: limit - 9].rstrip("-") or "x"
    return f"{head}-{_digest(text)}"


def label_value(text: str) -> str:
    """``text`` when it is a valid label value, else a shortened one ending in its hash."""
    return text if len(text) <= 63 and _LABEL_VALUE.match(text) else dns_label(text)


def child_base(service_name: str) -> str:
    """The prefix of every child's name (``<base>-engine``, ``<base>-profile-<hash>``, ...)."""
    return dns_label(service_name, BASE_LIMIT)


def child_name(service_name: str, component: str) -> str:
    return f"{child_base(service_name)}-{component}"
