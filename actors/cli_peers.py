"""``kinbox peers``: this device's identity, pairing, and the grants of paired devices.

``whoami`` shows the device id; ``invite`` (on the receiving device) prints a
one-time pairing code and stores only a hash derived from it; ``invites`` lists the codes
still open by id, and ``withdraw`` makes one invalid; ``pair URL [CODE]`` (on the
sending device) redeems it over the peer's websocket (the code read from standard input
when left out, so that no other user sees it in the process list); ``list`` shows every
paired device with its scopes, status, last contact and row counts;
``pause``, ``resume`` and ``revoke`` change a device's grant (a live link
closes within a second). Like the other operator commands they work on the
database while a runtime runs on it.
"""

from __future__ import annotations

import argparse
import getpass
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

from ..persistence import RowNotFound, default_url, require_current, upgrade
from ..persistence.opened import opened
from ..persistence.peers import DeviceRecord, PeerStore
from ..transport.errors import TransportError
from ..transport.frames import shown
from ..transport.grants import change_status, invite_id, parse_scopes, parse_ttl
from ..transport.identity import DeviceIdentity
from ..transport.invite_code import invite_ref, parse_code
from ..transport.key_file import private_folder
from .cli_args import common
from .cli_ops import operator_clock, refuse_old_schema
from .cli_output import emit, emit_all, when
from .data_dirs import add_data_dir_flag, resolve_data_dir
from .errors import ConfigError


@contextmanager
def _peers(args: argparse.Namespace, *, create: bool = False, read_only: bool = False
           ) -> Iterator[tuple[PeerStore, DeviceIdentity | None]]:
    """The peer tables and, with ``create``, this device's identity. Only the commands
    that make this a device (``whoami``, ``invite``, ``pair``) create the database and the
    device key, as a runtime would; the others, like ``inbox list``, refuse a database
    that is not there (a mistyped ``--db`` leaves nothing behind), and an old schema, as
    ``inbox requeue`` does: upgrading it unasked migrated a shared database under the
    runtimes of the old version, past the ``db status`` gate a deploy waits on. Those
    that only read (``list``, ``invites``) open it ``read_only``, as ``inbox list``
    does."""
    url = args.db or default_url()
    if create and url.startswith("sqlite:///"):  # like the runtime: a new device's folder
        private_folder(Path(url[len("sqlite:///"):]).expanduser().parent)
    if not create and not read_only:
        refuse_old_schema(url)  # before an open for writing changes the file
    # A new device's database is made (or brought up to date) as a runtime's start would.
    with opened(url, must_exist=not create, read_only=read_only,
                schema=upgrade if create else require_current,
                writer_name="kinbox-cli-writer") as (tables, writer):
        try:
            # The peer service (websockets and the link) loads with the commands that make
            # this a device, not with every command line.
            from .peers import device_identity

            identity = (device_identity(resolve_data_dir(url, args.data_dir))
                        if create else None)
            yield PeerStore(tables, writer), identity
        except (TransportError, ValueError) as exc:
            raise ConfigError(str(exc)) from exc


@contextmanager
def _device(args: argparse.Namespace) -> Iterator[tuple[PeerStore, DeviceIdentity]]:
    """:func:`_peers` with this device's identity (created if new)."""
    with _peers(args, create=True) as (peers, identity):
        assert identity is not None
        yield peers, identity


def whoami(args: argparse.Namespace, out: TextIO) -> int:
    """``kinbox peers whoami``."""
    with _device(args) as (_, identity):
        data = {"device_id": identity.device_id, "public_key": identity.public_key}
    emit(out, args.json, data, [f"device_id: {identity.device_id}",
                                f"public_key: {identity.public_key}"])
    return 0


def invite(args: argparse.Namespace, out: TextIO) -> int:
    """``kinbox peers invite``: a one-time pairing code for another device."""
    try:
        scopes, ttl = parse_scopes(args.scope or ["agent"]), args.ttl
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    with _device(args) as (peers, identity), operator_clock(peers.t.db) as clock:
        now = clock.now()  # the runtimes' (on PostgreSQL the server's): they check expiry
        from .peers import new_invite  # as in _peers

        code = new_invite(identity, peers, scopes, ttl, now)
    ref = invite_id(parse_code(code).invite_hash)
    data = {"code": code, "invite_id": ref, "device_id": identity.device_id,
            "scopes": sorted(scopes), "expires_at": now + ttl}
    emit(out, args.json, data, [code, f"(one-time pairing code for device "
                                      f"{identity.device_id}, expires {when(now + ttl)} UTC;"
                                      f" invite {ref}: kinbox peers withdraw {ref})"])
    return 0


def invites(args: argparse.Namespace, out: TextIO) -> int:
    """``kinbox peers invites``: the pairing codes not used and not expired, by id."""
    with _peers(args, read_only=True) as (peers, _), operator_clock(peers.t.db) as clock:
        found = peers.open_invites(clock.now())
    data = [{"invite_id": invite_id(i.code_hash), "scopes": sorted(i.scopes),
             "expires_at": i.expires_at} for i in found]
    emit_all(out, args.json, data, [f"{d['invite_id']}  {','.join(d['scopes']):<8} expires "
                                f"{when(d['expires_at'])} UTC" for d in data]
         or ["no open pairing invites"])
    return 0


def withdraw(args: argparse.Namespace, out: TextIO) -> int:
    """``kinbox peers withdraw INVITE``: an open pairing code (or its invite id) can pair
    nothing any more."""
    ref = invite_ref(args.invite)
    if ref is None:
        raise ConfigError("give a pairing code, or an invite id as 'kinbox peers invites' "
                          "lists it (12 hex characters)", field="invite")
    with _peers(args) as (peers, _), operator_clock(peers.t.db) as clock:
        gone = peers.withdraw_invite(ref, clock.now())
    if gone is None:
        raise RowNotFound("open pairing invite", invite_id(ref))
    data = {"invite_id": invite_id(gone.code_hash), "withdrawn": True}
    emit(out, args.json, data, [f"invite {data['invite_id']} withdrawn: its code pairs "
                                "nothing any more"])
    return 0


CODE_FROM_STDIN = "-"
"""``pair``'s code argument that means: read the code from standard input."""


def _pairing_code(given: str) -> str:
    """The code ``pair`` was given, or for ``-`` (the default) the one read from standard
    input, without echo on a terminal. A code in the command line is in the process's
    ``/proc/<pid>/cmdline``, which every user of the machine may read while ``pair``
    runs (a second of imports before it dials): one of them could redeem it first."""
    if given != CODE_FROM_STDIN:
        return given
    if sys.stdin is None:
        return ""
    if sys.stdin.isatty():
        return getpass.getpass("pairing code: ").strip()
    return sys.stdin.readline().strip()


def pair(args: argparse.Namespace, out: TextIO) -> int:
    """``kinbox peers pair URL [CODE]``."""
    code = _pairing_code(args.code)
    with _device(args) as (peers, identity), operator_clock(peers.t.db) as clock:
        from .peers import complete_pairing  # as in _peers

        rec = complete_pairing(identity, peers, args.url, code, args.name or "", clock.now())
    emit(out, args.json, rec.to_dict(),
         [f"paired with device {rec.device_id}: address it as peer:{rec.device_id}"])
    return 0


def listing(args: argparse.Namespace, out: TextIO) -> int:
    """``kinbox peers list``."""
    with _peers(args, read_only=True) as (peers, _):
        counts = peers.row_counts()
        data = []
        for rec in peers.devices():
            row = rec.to_dict()
            c = counts.get(rec.device_id, {}) if rec.direction == "outbound" else {}
            row["queued"] = c.get("pending", 0) + c.get("processing", 0)
            row["failed"] = c.get("failed", 0)
            row["delivered"] = c.get("delivered", 0)
            data.append(row)
    lines = [f"{'device':<13} {'direction':<9} {'status':<8} {'scopes':<8} {'queued':>6} "
             f"{'failed':>6}  {'last seen':<19} name"]
    lines += [f"{d['device_id']:<13} {d['direction']:<9} {d['status']:<8} "
              f"{','.join(d['scopes']):<8} {d['queued']:>6} {d['failed']:>6}  "
              f"{when(d['last_seen_at']):<19} "
              # A name paired before names were checked may hold escape sequences.
              + (f"! {d['last_error']}" if d["status"] == "active" and d["last_error"]
                 else shown(d["name"])) for d in data]
    emit_all(out, args.json, data, lines if data else ["no paired devices"])
    return 0


CHANGE_TRIES = 5
"""Reads of a grant whose status other commands keep changing, before giving up."""


def change(args: argparse.Namespace, out: TextIO) -> int:
    """``kinbox peers pause|resume|revoke DEVICE [--direction inbound|outbound]``.

    Each of the device's grants (or the one ``--direction`` names) changes if the action
    applies to it; one it does not apply to (pausing a revoked one) is left as it is and
    said so, and only when it applies to none is it an error: one direction's state
    must not keep the operator from acting on the other."""
    with _peers(args) as (peers, _), operator_clock(peers.t.db) as clock:
        device = [r for r in peers.devices() if r.device_id == args.device_id]
        if not device:
            raise RowNotFound("paired device", args.device_id)
        recs = [r for r in device if args.direction in (None, r.direction)]
        if not recs:
            raise ConfigError(f"device {args.device_id} has no {args.direction} grant: it is "
                              f"paired {' and '.join(r.direction for r in device)} only",
                              field="direction")
        changes, left = [], []
        for r in recs:
            now_read, outcome = _change(peers, r, args.action, clock.now)
            if isinstance(outcome, ValueError):
                left.append((now_read, str(outcome)))
            else:
                changes.append((now_read, outcome))
        if not changes:
            raise ConfigError(left[0][1])
    data = [{"device_id": r.device_id, "direction": r.direction, "status": s, "changed": True}
            for r, s in changes]
    data += [{"device_id": r.device_id, "direction": r.direction, "status": r.status,
              "changed": False, "reason": why} for r, why in left]
    emit(out, args.json, {"device_id": args.device_id, "grants": data},
         [f"{d['device_id']} ({d['direction']}): {d['status']}"
          + ("" if d["changed"] else f", left as is: {d['reason']}") for d in data])
    return 0


def _change(peers: PeerStore, rec: DeviceRecord, action: str, now: Callable[[], float]
            ) -> tuple[DeviceRecord, str | ValueError]:
    """Apply ``action`` to one grant: the grant as last read, and its new status or why
    the action does not apply to it. Written only where the status is still the one the
    change was decided on: a resume decided on ``paused`` wrote ``active`` over a revoke
    committed since (another terminal), and the device cut off could link again. A
    status that moved is read again and decided anew."""
    for _ in range(CHANGE_TRIES):
        try:
            status = change_status(rec.status, action).value
        except ValueError as exc:
            return rec, exc
        if peers.set_status(rec.device_id, status, now(), direction=rec.direction,
                            last_error=f"{action}d by the operator" if status != "active"
                            else None, expected=rec.status):
            return rec, status
        again = [r for r in peers.devices(rec.direction) if r.device_id == rec.device_id]
        if not again:  # unpaired meanwhile
            raise RowNotFound("paired device", rec.device_id)
        rec = again[0]
    raise ConfigError(f"the {rec.direction} grant of {rec.device_id} kept changing under "
                      f"this command; try again")


def _ttl(text: str) -> float:
    # An argparse type, so a bad --ttl is a usage error (2) like a bad --limit.
    try:
        return parse_ttl(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``peers``."""
    def with_key(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        add_data_dir_flag(p)
        return common(p)

    peers = sub.add_parser("peers", help="device identity, pairing and grants")
    psub = peers.add_subparsers(dest="action", required=True)
    with_key(psub.add_parser("whoami", help="this device's id")).set_defaults(handler=whoami)
    p = with_key(psub.add_parser("invite", help="print a one-time pairing code"))
    p.add_argument("--scope", action="append", choices=["agent"])
    p.add_argument("--ttl", type=_ttl, default="10m",
                   help="how long the code is valid, 1s to 7d (default 10m)")
    p.set_defaults(handler=invite)
    p = with_key(psub.add_parser("pair", help="pair with a device using its code"))
    p.add_argument("url", help="the other device's kinbox serve URL, http://host:port")
    p.add_argument(
        "code",
        nargs="?",
        default=CODE_FROM_STDIN,
        help="the code 'kinbox peers invite' printed there; left out or '-': read from "
        "standard input (a code in the command line is visible to every user of this "
        "machine while pair runs)",
    )
    p.add_argument("--name", help="what to call that device here")
    p.set_defaults(handler=pair)
    with_key(psub.add_parser("invites", help="pairing codes not used and not expired")
             ).set_defaults(handler=invites)
    p = with_key(psub.add_parser("withdraw", help="make an unused pairing code invalid"))
    p.add_argument("invite", help="the code, or its invite id from 'kinbox peers invites'")
    p.set_defaults(handler=withdraw)
    with_key(psub.add_parser("list", help="paired devices and their grants")).set_defaults(
        handler=listing)
    for action in ("pause", "resume", "revoke"):
        p = with_key(psub.add_parser(action, help=f"{action} a device's grant"))
        p.add_argument("device_id")
        p.add_argument("--direction", choices=("inbound", "outbound"),
                       help="only the grant the device holds here (inbound) or the one this "
                            "runtime holds there (outbound); default: each it applies to")
        p.set_defaults(handler=change)
