"""HTML that values from traffic cannot break out of: JSON safe inside ``<script>``, and a strict policy.

Every HTML page the sidecar serves or the CLI writes goes through :func:`harden`:

- :func:`script_json` is what embeds data in a ``<script>``: ``<``, ``>``, ``&``
  and the two JavaScript line separators are written as ``\\uXXXX`` escapes,
  which are the same string to a JSON or JavaScript parser, so a value holding
  ``</script><script>...`` stays a string;
- :func:`policy` is a Content-Security-Policy that runs only the page's own
  inline scripts, named by their SHA-256 (no ``unsafe-inline``, no
  ``unsafe-eval``, nothing loaded from anywhere, no form posts, no framing);
  :func:`harden` puts it in a ``<meta http-equiv>`` so a written file carries
  it too, and the server sends it as a header as well.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from typing import Any

_SCRIPT = re.compile(rb"<script\b([^>]*)>(.*?)</script\s*>", re.DOTALL | re.IGNORECASE)
_ESCAPES = {ord("<"): "\\u003c", ord(">"): "\\u003e", ord("&"): "\\u0026", 0x2028: "\\u2028", 0x2029: "\\u2029"}


def script_json(obj: Any, **kw: Any) -> str:
    """``json.dumps(obj)`` that is safe between ``<script>`` and ``</script>``."""
    return json.dumps(obj, **kw).translate(_ESCAPES)


class ScriptSafeJson:
    """A stand-in for the ``json`` module whose ``dumps`` is :func:`script_json` (for code we do not own)."""

    dumps = staticmethod(script_json)
    loads = staticmethod(json.loads)
    dump = staticmethod(json.dump)
    load = staticmethod(json.load)
    JSONEncoder = json.JSONEncoder


class UnsafeHTML(ValueError):
    """A page whose inline script holds ``</script`` or ``<!--``: data that would break out of the script."""


def policy(page: bytes) -> str:
    """The Content-Security-Policy for ``page``: its own inline scripts by hash, styles and data: fonts/images."""
    hashes = []
    for attrs, body in _SCRIPT.findall(page):
        if b"src=" in attrs.lower():
            raise UnsafeHTML("the page loads an external script")
        if re.search(rb"</script|<!--", body, re.IGNORECASE):
            raise UnsafeHTML("an inline script contains </script or <!-- (unescaped data?)")
        hashes.append("'sha256-" + base64.b64encode(hashlib.sha256(body).digest()).decode() + "'")
    scripts = " ".join(sorted(set(hashes))) or "'none'"
    return (f"default-src 'none'; script-src {scripts}; style-src 'unsafe-inline'; img-src data:; font-src data:; "
            "connect-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")


def harden(page: bytes) -> tuple[bytes, str]:
    """``page`` with its policy as a ``<meta http-equiv>`` at the top of ``<head>``, and the policy.

    Raises:
        UnsafeHTML: an inline script holds ``</script`` or ``<!--``.
    """
    csp = policy(page)
    meta = b'<meta http-equiv="Content-Security-Policy" content="' + csp.encode() + b'">'
    m = re.search(rb"<head\b[^>]*>", page, re.IGNORECASE)
    at = m.end() if m else 0
    return page[:at] + meta + page[at:], csp


def headers(csp: str) -> dict[str, str]:
    """The response headers of a hardened page."""
    return {"Content-Security-Policy": csp, "X-Content-Type-Options": "nosniff", "Cache-Control": "no-store"}
