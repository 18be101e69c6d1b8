"""The flags of ``kinbox serve``: ports, bind addresses, allowed hosts, the operator token.

Each argparse ``type`` here turns a bad value into a usage error (status 2,
no traceback). The rule for what counts as loopback lives here, as does
where the operator token comes from: ``--token-file`` (first line of the
file) or ``$KINBOX_OPERATOR_TOKEN``. Only the token's digest leaves this
module (:class:`~kinbox.transport.OperatorToken`); it is never printed.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
from pathlib import Path

from ..transport import OperatorToken, allowed_name

TOKEN_ENV = "KINBOX_OPERATOR_TOKEN"
WILDCARD_ADDRESSES = ("0.0.0.0", "::")


def port_number(text: str) -> int:
    """An argparse type: a TCP port, 0 (any free port) to 65535, in ASCII digits (``int``
    also takes "1_000" and other scripts' digits)."""
    if not (text.isascii() and text.strip().isdigit()):
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}")
    port = int(text)
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port {port} is out of range (0 to 65535; "
                                         "0 picks a free port)")
    return port


def host_name(text: str) -> str:
    """An argparse type: a name the server may answer to (``--allow-host``)."""
    if text.strip() == "*":
        raise argparse.ArgumentTypeError("'*' would answer any Host, which lets any web page "
                                         "reach the server (DNS rebinding); name the hosts")
    try:
        return allowed_name(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a host name: {text!r} (expected a name such "
                                         "as kinbox.example, *.example.com or an IP)") from None


def is_loopback(host: str) -> bool:
    """True when binding ``host`` is reachable only from this machine."""
    host = host.strip("[]")
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name: it may resolve to anything


def read_token(token_file: str | None) -> OperatorToken | None:
    """The operator token from ``token_file`` or the environment, or None when neither.

    Raises :class:`ValueError` naming the source (never the token) when the
    file cannot be read or the token is empty.
    """
    if token_file:
        try:
            # utf-8-sig: a byte-order mark (Notepad, PowerShell) is not part of the token.
            text = Path(token_file).read_text(encoding="utf-8-sig").splitlines()
        except OSError as exc:
            raise ValueError(f"--token-file {token_file}: {exc.strerror or exc}") from None
        except UnicodeDecodeError:
            raise ValueError(f"--token-file {token_file}: not UTF-8 text") from None
        try:
            return OperatorToken.from_secret(text[0] if text else "")
        except ValueError:
            raise ValueError(f"--token-file {token_file}: the file holds no token") from None
    secret = os.environ.get(TOKEN_ENV, "")
    return OperatorToken.from_secret(secret) if secret.strip() else None
