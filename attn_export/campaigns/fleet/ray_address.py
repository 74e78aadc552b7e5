"""``--ray``: the address checked before any work, and a cluster that is not there found in seconds.

Why: ``ray.init(address="127.0.0.1:1")`` with nothing listening retries its connection to the GCS
for minutes, silently; a typo (``--ray nonsense``, ``--ray ''``) ended in a traceback. So the address
must be ``auto`` or ``[ray://]HOST:PORT`` and, before ``ray.init``, a plain TCP connection to it must
open within ``CONNECT_TIMEOUT_S`` (ray.init has no connection timeout of its own for a cluster address).
"""

from __future__ import annotations

import re
import socket

from attn_export.errors import ConfigError

__all__ = ["CONNECT_TIMEOUT_S", "RayAddress", "check_reachable", "parse_ray_address"]

CONNECT_TIMEOUT_S = 10.0
_HOST = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?)$")
_FIX = "pass --ray auto (start or join a local Ray) or --ray HOST:PORT of a running head (ray start --head prints it)"

RayAddress = tuple[str, str, int] | None  # (what ray.init is given, host, port); None for auto


def parse_ray_address(address: str) -> RayAddress:
    """``auto`` -> None; ``[ray://]HOST:PORT`` -> (address, host, port); anything else is refused in one line."""
    if address == "auto":
        return None
    rest = address[len("ray://") :] if address.startswith("ray://") else address
    host, sep, port = rest.rpartition(":")
    if not sep or not _HOST.match(host) or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"expected --ray auto or HOST:PORT, got {address!r}; {_FIX}")
    return address, host.strip("[]"), int(port)


def check_reachable(parsed: RayAddress, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """A TCP connection to the head opens within ``timeout_s``; else one line, not ray.init's silent retries."""
    if parsed is None:
        return
    address, host, port = parsed
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            pass
    except OSError as e:
        why = "timed out" if isinstance(e, TimeoutError) else (e.strerror or type(e).__name__).lower()
        raise ConfigError(f"cannot reach a Ray cluster at {address} within {timeout_s:g} s ({why}); "
                          "start one with 'ray start --head' or pass --ray auto") from None  # fmt: skip
