"""Paired devices, their grants and pairing invites: the rows behind ``kinbox peers``.

The rules (token format, statuses, what a scope allows) live in
``kinbox.transport.grants``; this store only keeps rows, and never sees a
token or a pairing code in plain text: callers pass a SHA-256 (of the token; of the
invite key a code's secret seeds, ``transport.invite_code``).
Redeeming an invite is a compare-and-set inside one transaction, so a code
pairs one device even when two try at once; the same device redeeming it again
(its answer was lost) gets its untouched grant with a new token. What "untouched"
means (the same key, still active, made by this code, never seen on a link) is
decided here, in that transaction (``_redeem_again``), because it is a condition
on rows that must not change between the read and the write; ``grants`` decides
whether the code may be redeemed again at all.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import peewee as pw

from .errors import RowNotFound
from .models import PeerDevice, Tables
from .writer import GroupCommitWriter

INBOUND = "inbound"
OUTBOUND = "outbound"
PEER_TRANSPORT = "suzent_peer"


@dataclass(frozen=True)
class DeviceRecord:
    """One direction of a paired device."""

    device_id: str
    direction: str
    name: str
    public_key: str
    url: str | None
    token_hash: str | None
    token_sealed: str | None
    scopes: frozenset[str]
    status: str
    last_error: str | None
    created_at: float
    updated_at: float
    last_seen_at: float | None

    def to_dict(self) -> dict[str, Any]:
        """The record as listings show it (no token material)."""
        return {"device_id": self.device_id, "direction": self.direction, "name": self.name,
                "public_key": self.public_key, "url": self.url, "scopes": sorted(self.scopes),
                "status": self.status, "last_error": self.last_error,
                "created_at": self.created_at, "last_seen_at": self.last_seen_at}


@dataclass(frozen=True)
class InviteRecord:
    """A pairing invite (its code is known only by the hash of the invite key it seeds)."""

    code_hash: str
    scopes: frozenset[str]
    expires_at: float
    used: bool
    used_by: str | None = None
    """The device that redeemed it."""


def _record(r: PeerDevice) -> DeviceRecord:
    return DeviceRecord(r.device_id, r.direction, r.name, r.public_key, r.url, r.token_hash,
                        r.token_sealed, frozenset(filter(None, r.scopes.split(","))), r.status,
                        r.last_error, r.created_at, r.updated_at, r.last_seen_at)


def _key(device_id: str, direction: str) -> str:
    return f"{direction}:{device_id}"


class PeerStore:
    """Devices, grants and invites on one database."""

    def __init__(self, tables: Tables, writer: GroupCommitWriter) -> None:
        self.t = tables
        self.writer = writer

    # -- invites ---------------------------------------------------------------------------

    def add_invite(self, code_hash: str, scopes: frozenset[str], now: float,
                   expires_at: float) -> None:
        """Store a new invite by the hash of its code."""
        i = self.t.invite
        self.writer.call(lambda: i.insert(code_hash=code_hash, scopes=",".join(sorted(scopes)),
                                          created_at=now, expires_at=expires_at).execute())

    def invite(self, code_hash: str) -> InviteRecord | None:
        """The invite with this code hash, or None."""
        i = self.t.invite
        r = i.get_or_none(i.code_hash == code_hash)
        if r is None:
            return None
        return InviteRecord(r.code_hash, frozenset(r.scopes.split(",")), r.expires_at,
                            r.used_at is not None, r.used_by)

    def open_invites(self, now: float) -> list[InviteRecord]:
        """The invites not used and not expired at ``now``, soonest to expire first."""
        i = self.t.invite
        return [InviteRecord(r.code_hash, frozenset(r.scopes.split(",")), r.expires_at, False)
                for r in i.select().where(i.used_at.is_null(), i.expires_at > now)
                .order_by(i.expires_at, i.code_hash)]

    def withdraw_invite(self, code_hash_prefix: str, now: float) -> InviteRecord | None:
        """Delete the one open invite whose code hash starts with ``code_hash_prefix`` (its
        code can pair nothing from then on); None when no open invite, or more than one,
        has it."""
        i = self.t.invite

        def op() -> InviteRecord | None:
            is_open = i.used_at.is_null() & (i.expires_at > now)
            rows = list(i.select().where(i.code_hash.startswith(code_hash_prefix), is_open)
                        .limit(2))
            # Open when deleted, not only when read: on PostgreSQL a redemption (another
            # process) may commit between the two, and its code was then said withdrawn.
            if len(rows) != 1 or not i.delete().where(i.code_hash == rows[0].code_hash,
                                                      is_open).execute():
                return None
            return InviteRecord(rows[0].code_hash, frozenset(rows[0].scopes.split(",")),
                                rows[0].expires_at, False)
        return self.writer.call(op)  # type: ignore[no-any-return]

    def redeem(self, code_hash: str, now: float, device_id: str, name: str, public_key: str,
               token_hash: str) -> bool:
        """Use the invite once and store the inbound grant (or answer the same device's
        retry, see :meth:`redeem_now`); False if it was used or expired, or if the device
        id has a grant of another key (nothing is spent then)."""
        return bool(self.writer.call(lambda: self.redeem_now(code_hash, now, device_id, name,
                                                             public_key, token_hash)))

    def redeem_now(self, code_hash: str, now: float, device_id: str, name: str,
                   public_key: str, token_hash: str) -> bool:
        """:meth:`redeem` on the writer thread, in the caller's transaction (with whatever
        else the pairing writes, so a failure after it spends no code)."""
        i, d = self.t.invite, self.t.device
        row = i.get_or_none(i.code_hash == code_hash)
        if row is None:
            return False
        held = d.get_or_none(d.id == _key(device_id, INBOUND))
        if held is not None and held.public_key != public_key:
            # The id is 48 bits of the key's hash: another key with a paired device's id
            # was ground to match it, and would take over that device's grant and session.
            return False
        taken = i.update(used_at=now, used_by=device_id).where(
            i.code_hash == code_hash, i.used_at.is_null(), i.expires_at > now).execute()
        if not taken:
            return self._redeem_again(code_hash, now, device_id, public_key, token_hash)
        d.delete().where(d.id == _key(device_id, INBOUND)).execute()
        d.insert(id=_key(device_id, INBOUND), device_id=device_id, direction=INBOUND,
                 name=name, public_key=public_key, token_hash=token_hash,
                 scopes=row.scopes, status="active", created_at=now,
                 updated_at=now).execute()
        return True

    def _redeem_again(self, code_hash: str, now: float, device_id: str, public_key: str,
                      token_hash: str) -> bool:
        """The same device redeems a code it redeemed before: the answer (its token) was
        lost on the way, a connection dropped after the commit, and only the hash of the
        token is kept, so the grant gets the new token ``token_hash`` in place of the one
        nobody received. Only while the grant is as that redemption made it: the same key
        (the caller checked the request's signature with it), active, created by this
        code (not replaced by a later pairing) and never used on a link (a device that
        used it had its answer); anything else keeps the code spent. Idempotent for the
        device, which ends with one grant and the token it was told, whichever try's
        answer reached it last."""
        i, d = self.t.invite, self.t.device
        row = i.get_or_none(i.code_hash == code_hash)
        if row is None or row.used_at is None or row.used_by != device_id:
            return False
        return bool(d.update(token_hash=token_hash, updated_at=now).where(
            d.id == _key(device_id, INBOUND), d.public_key == public_key,
            d.status == "active", d.created_at == row.used_at,
            d.last_seen_at.is_null()).execute())

    # -- devices ---------------------------------------------------------------------------

    def save_outbound(self, device_id: str, name: str, public_key: str, url: str,
                      token_sealed: str, scopes: frozenset[str], now: float) -> DeviceRecord:
        """Store (or replace) what we need to reach a device that granted us access."""
        d = self.t.device

        def op() -> None:
            d.delete().where(d.id == _key(device_id, OUTBOUND)).execute()
            d.insert(id=_key(device_id, OUTBOUND), device_id=device_id, direction=OUTBOUND,
                     name=name, public_key=public_key, url=url, token_sealed=token_sealed,
                     scopes=",".join(sorted(scopes)), status="active", created_at=now,
                     updated_at=now).execute()
        self.writer.call(op)
        found = self.device(device_id, OUTBOUND)
        assert found is not None
        return found

    def device(self, device_id: str, direction: str) -> DeviceRecord | None:
        """One direction of a device, or None."""
        d = self.t.device
        r = d.get_or_none(d.id == _key(device_id, direction))
        return _record(r) if r else None

    def by_token_hash(self, token_hash: str) -> DeviceRecord | None:
        """The inbound grant issued with this token hash, or None."""
        d = self.t.device
        r = d.get_or_none(d.token_hash == token_hash, d.direction == INBOUND)
        return _record(r) if r else None

    def devices(self, direction: str | None = None) -> list[DeviceRecord]:
        """Every paired device row, oldest first."""
        d = self.t.device
        q = d.select().order_by(d.created_at, d.id)
        if direction is not None:
            q = q.where(d.direction == direction)
        return [_record(r) for r in q]

    def set_status(self, device_id: str, status: str, now: float, *,
                   direction: str | None = None, last_error: str | None = None,
                   expected: str | None = None) -> int:
        """Set a device's status (both directions unless one is named); rows changed.
        ``expected``: only where the status is still that (the one the change was decided
        on), else 0: a resume decided on ``paused`` must not undo a revoke committed
        since."""
        d = self.t.device
        grants = d.device_id == device_id
        if direction is not None:
            grants &= d.direction == direction
        which = grants if expected is None else grants & (d.status == expected)
        n = self.writer.call(lambda: d.update(status=status, last_error=last_error,
                                              updated_at=now).where(which).execute())
        if n or (expected is not None and d.select().where(grants).exists()):
            return int(n)  # 0: the status moved since it was read
        raise RowNotFound(f"no paired device {device_id!r}")

    def touch(self, device_id: str, direction: str, now: float) -> None:
        """Record that the device was just seen on a link; an active device's noted problem
        is over (a paused or revoked one keeps the reason it was given)."""
        d = self.t.device
        cleared = pw.Case(None, [(d.status == "active", None)], d.last_error)
        self.writer.call(lambda: d.update(last_seen_at=now, last_error=cleared).where(
            d.id == _key(device_id, direction)).execute())

    def close_outbound(self, device_id: str, token_sealed: str | None, status: str,
                       reason: str, now: float) -> bool:
        """Record that the device refused the grant sealed as ``token_sealed`` for good
        (``status``: revoked or paused); False, changing nothing, when the device was
        paired again meanwhile (the refusal was of the old token, not of the new one).
        A grant revoked here stays revoked (a "paused" heard on an exchange under way as
        the operator revoked it: a later resume re-enabled it), and counts as closed."""
        d = self.t.device
        grant = (d.id == _key(device_id, OUTBOUND)) & (d.token_sealed == token_sealed)
        revoked = d.status == "revoked"
        # Decided by the write itself, not by a read before it: on PostgreSQL a revoke
        # committed between the two (another process) was overwritten with "paused".
        which = grant if status == "revoked" else grant & ~revoked

        def op() -> bool:
            if d.update(status=status, last_error=reason, updated_at=now).where(
                    which).execute():
                return True
            return status != "revoked" and d.select().where(grant & revoked).exists()
        return self.writer.call(op)

    def note_problem(self, device_id: str, direction: str, text: str, now: float) -> None:
        """Record why the device's link is failing, leaving its status as it is."""
        d = self.t.device
        self.writer.call(lambda: d.update(last_error=text, updated_at=now).where(
            d.id == _key(device_id, direction)).execute())

    def row_counts(self) -> dict[str, dict[str, int]]:
        """Outbound inbox rows per device and state (queued, delivered, failed...)."""
        m = self.t.inbox
        q = (m.select(m.destination_peer_id, m.status, pw.fn.COUNT(m.message_id).alias("n"))
             .where(m.transport == PEER_TRANSPORT)
             .group_by(m.destination_peer_id, m.status))
        out: dict[str, dict[str, int]] = {}
        for r in q:
            out.setdefault(r.destination_peer_id or "", {})[r.status] = r.n
        return out

    def ensure_session_now(self, session_id: str, project_id: str | None, title: str,
                           now: float) -> None:
        """Create a ``remote`` session if missing (on the writer thread, in the caller's
        transaction)."""
        s = self.t.session
        if not s.select().where(s.id == session_id).exists():
            s.insert(id=session_id, project_id=project_id, title=title, kind="remote",
                     status="idle", config="{}", created_at=now, updated_at=now).execute()
