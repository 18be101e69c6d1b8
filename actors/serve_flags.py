"""The command line of ``kinbox serve``: its flags (ports, bind addresses, allowed hosts,
the operator token) and its parser.

Each argparse ``type`` here turns a bad value into a usage error (status 2,
no traceback). Where the operator token comes from lives here: ``--token-file``
(first line of the file) or ``$KINBOX_OPERATOR_TOKEN`` (what counts as loopback is
:func:`kinbox.transport.host_names.is_loopback`, the app's rule too). Only the token's
digest leaves this module (:class:`~kinbox.transport.OperatorToken`); it is never
printed. A token file other users may read or write (``echo secret > token`` under umask
022) is said to be (:func:`token_file_exposure`): not refused, as a secret mounted read-only for all
(0444) is one too, and its operator may have no other way to give it.
"""

from __future__ import annotations

import argparse
import os
import stat
from pathlib import Path
from typing import TextIO

from ..transport.host_names import allowed_name
from ..transport.operator_token import OperatorToken
from .cli_args import DB_HELP, database_url
from .data_dirs import add_data_dir_flag

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
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def bind_address(text: str) -> str:
    """An argparse type: the address ``--host`` binds, an IP address or a host name (the
    server answers it as a Host name too, so it must be one). An empty one would bind
    every interface."""
    name = text.strip()
    try:
        if name.startswith("*"):
            raise ValueError(name)
        allowed_name(name)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not an address to bind: {text!r} (expected an IP address such as 127.0.0.1, "
            "::1 or 0.0.0.0, or a host name; the port goes in --port)") from None
    return name


def read_token(token_file: str | None) -> OperatorToken | None:
    """The operator token from ``token_file`` or the environment, or None when neither.

    Raises :class:`ValueError` naming the source (never the token) when the
    file cannot be read or the token is empty or one a client could not send
    (:meth:`OperatorToken.from_secret`).
    """
    if token_file is not None:
        if not token_file.strip():  # not "no flag": the operator meant a file
            raise ValueError("--token-file: give the path of the file that holds the token")
        try:
            # utf-8-sig: a byte-order mark (Notepad, PowerShell) is not part of the token.
            text = Path(token_file).read_text(encoding="utf-8-sig").splitlines()
        except OSError as exc:
            raise ValueError(f"--token-file {token_file}: {exc.strerror or exc}") from None
        except UnicodeDecodeError:
            raise ValueError(f"--token-file {token_file}: not UTF-8 text") from None
        first = text[0] if text else ""
        if not first.strip():
            raise ValueError(f"--token-file {token_file}: the file holds no token")
        try:
            return OperatorToken.from_secret(first)
        except ValueError as exc:  # the reason, never the token
            raise ValueError(f"--token-file {token_file}: {exc}") from None
    secret = os.environ.get(TOKEN_ENV, "")
    if not secret.strip():
        return None
    try:
        return OperatorToken.from_secret(secret)
    except ValueError as exc:
        raise ValueError(f"${TOKEN_ENV}: {exc}") from None


def token_file_exposure(token_file: str | None) -> str | None:
    """Why other users of this machine may read or change the token in ``token_file`` (its
    mode lets group or others at it), or None; named by its path and mode, never its text."""
    if token_file is None:
        return None
    try:
        mode = stat.S_IMODE(Path(token_file).stat().st_mode)
    except OSError:  # read a moment ago: gone since, nothing left to say of it
        return None
    if not mode & (stat.S_IRWXG | stat.S_IRWXO):
        return None
    return (
        f"--token-file {token_file} has mode {mode:o}: other users of this machine may "
        "read or change the operator token; chmod 600 it"
    )


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``serve``; its server (uvicorn, the runtime) loads when it runs, not with
    every command line."""
    p = sub.add_parser("serve", help="run the HTTP API (and, with --brain, deliver)")
    p.add_argument(
        "--host",
        default="127.0.0.1",
        type=bind_address,
        help="bind address (default 127.0.0.1; anything else needs --allow-host "
        "and an operator token)",
    )
    p.add_argument(
        "--port", type=port_number, default=8765, help="TCP port (default 8765; 0 picks a free one)"
    )
    p.add_argument("--db", type=database_url, help=DB_HELP)
    add_data_dir_flag(p)
    p.add_argument(
        "--brain",
        metavar="MODULE:ATTR",
        help="deliver with this brain (e.g. myapp.agents:brain); "
        "without it the process is send-only",
    )
    p.add_argument(
        "--allow-host",
        action="append",
        type=host_name,
        default=[],
        metavar="NAME",
        help="a Host name to answer besides loopback (repeatable)",
    )
    p.add_argument(
        "--token-file",
        metavar="PATH",
        help="file whose first line is the operator token (else "
        "$KINBOX_OPERATOR_TOKEN); every call but GET / and /healthz then needs "
        "'Authorization: Bearer <token>'",
    )
    p.set_defaults(handler=_serve, parser=p)


def _serve(args: argparse.Namespace, out: TextIO) -> int:
    from .serve import handle

    return handle(args, out)
