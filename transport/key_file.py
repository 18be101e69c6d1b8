"""The device key file: created once with owner-only permissions, then loaded.

The only place that touches the private key on disk. The key is written to
a private temporary file (``O_EXCL``, mode 0600, so no other user can ever
read it) and then linked into place, which fails if the name exists: another
process starting at the same moment sees either no key file or a complete
one, never a half-written one; the folder is synced once the name is in it.
An existing file readable by group or others is refused rather than used, as
are (like ssh's StrictModes) a key file or a folder that another user owns, and a
folder that group or others may write: whoever may write the folder may swap the
key for theirs or delete it (and a new key would then be made, unpairing every peer).
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

from .errors import IdentityError
from .identity import DeviceIdentity

KEY_FILE_NAME = "device_key.pem"


def load_or_create(directory: str | os.PathLike[str]) -> DeviceIdentity:
    """This device's identity from ``directory/device_key.pem``, created on first use.

    :class:`IdentityError` naming the file when it cannot be used, read or made (a
    symlink to nothing, a folder in its place, a file in place of ``directory``): the
    caller learns which file and why, not a bare ``OSError`` of whichever step failed."""
    path = Path(directory) / KEY_FILE_NAME
    if path.is_symlink() and not path.exists():  # a secrets mount that is not mounted
        raise IdentityError(str(path), "a symlink to a file that is not there "
                            f"({os.readlink(path)})")
    try:
        if path.exists():
            _check_folder(path.parent)
            return _load(path)
        try:
            return install(directory, DeviceIdentity.generate())
        except FileExistsError:  # another process created it first: use theirs
            return _load(path)
    except OSError as exc:
        raise IdentityError(str(path), "cannot read or create the device key: "
                            f"{exc.strerror or exc}") from exc


def private_folder(folder: str | os.PathLike[str]) -> Path:
    """Make ``folder`` and every missing folder above it owner-only (0700), like ~/.ssh:
    ``mkdir(parents=True, mode=0o700)`` gives that mode to the last one only, the others
    the umask's (0755: anyone may list them). Folders that exist keep their mode."""
    path = Path(folder)
    missing = []
    at = path
    while not at.exists() and at != at.parent:
        missing.append(at)
        at = at.parent
    for level in reversed(missing):
        try:
            level.mkdir(mode=0o700)
        except FileExistsError:  # another process made it first
            pass
    path.mkdir(parents=True, exist_ok=True, mode=0o700)  # a file in the way still raises
    return path


def install(directory: str | os.PathLike[str], identity: DeviceIdentity) -> DeviceIdentity:
    """Write ``identity`` as the device key of ``directory``; FileExistsError if it has one."""
    folder = private_folder(directory)
    _check_folder(folder)
    # A random name: one made of the pid met the partial a killed process of the same pid
    # left behind (a container's process restarts with the same one) and failed for good.
    partial = folder / f".{KEY_FILE_NAME}.{secrets.token_hex(8)}"
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(identity.to_pem())
            f.flush()
            os.fsync(f.fileno())
        os.link(partial, folder / KEY_FILE_NAME)  # atomic; FileExistsError if taken
    finally:
        partial.unlink(missing_ok=True)
    # The name, not only the bytes: pairings sealed with this key are committed (synced)
    # right after, and a power cut must not leave them behind a key that is gone.
    dir_fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return identity


def _others_owner(st: os.stat_result) -> int | None:
    """The uid owning a file when it is neither this process's user nor root (whom
    nothing stops anyway), else None."""
    return st.st_uid if st.st_uid not in (os.geteuid(), 0) else None


def _check_folder(folder: Path) -> None:
    """Refuse a key folder another user could replace the key in."""
    st = folder.stat()
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise IdentityError(
            str(folder),
            f"permissions {oct(stat.S_IMODE(st.st_mode))} let other users replace or "
            "delete the device key in it; chmod 700 it",
        )
    owner = _others_owner(st)
    if owner is not None:
        raise IdentityError(
            str(folder),
            f"owned by another user (uid {owner}), who can replace the device key in it; "
            "chown it to this user",
        )


def _load(path: Path) -> DeviceIdentity:
    st = path.stat()
    mode = st.st_mode
    owner = _others_owner(st)
    if owner is not None:
        raise IdentityError(
            str(path),
            f"owned by another user (uid {owner}): this device would sign as whoever made "
            "it; chown it to this user",
        )
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise IdentityError(str(path), f"permissions {oct(mode & 0o777)} let others read "
                            "the private key; chmod 600 it")
    return DeviceIdentity.from_pem(path.read_bytes())
