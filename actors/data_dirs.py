"""Where a runtime keeps files beside its database (Focal's heartbeat.md, the device key).

One folder per database: next to a SQLite file, or under the data directory
for a server database, so two PostgreSQL databases never share one.
"""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path

from ..persistence import default_data_dir, pg_address, pg_default_port, sqlite_path


def data_dir_for(url: str) -> Path:
    """The files folder of a runtime on ``url``.

    Beside a SQLite file (``<dir>/kinbox-data``, symlinks resolved); for a server database, a
    folder of the data directory named for host, port and database as libpq
    reads them (:func:`~kinbox.persistence.pg_address`), so every way of
    writing one database's URL (either scheme, the default port given or not,
    percent-encoding) is one folder and one device key.

    Older kinbox named the folder after the URL as written: such a folder is
    used while it exists, so no device key is left behind. This spelling's own
    is looked for first (a deployment that had two keeps each), then the one of
    the URL written plainly without its default port.
    """
    path = sqlite_path(url)
    if path is not None:
        # Beside the file itself, symlinks resolved, as its owner lock is named: a runtime
        # reaching it through a link has the same device key. An older kinbox's folder
        # beside the link is used while the file has none of its own.
        own = Path(os.path.realpath(path)).parent / "kinbox-data"
        beside_link = path.parent / "kinbox-data"
        return beside_link if not own.is_dir() and beside_link.is_dir() else own
    folders = default_data_dir() / "databases"
    rest = url.partition("://")[2].split("?", 1)[0]  # the query may hold '@' (a password)
    written = _folder_name(rest.rpartition("@")[2])
    try:
        host, port, database = pg_address(url)
    except ValueError:  # no database named: opening it fails and says why
        return folders / written
    named = _folder_name(f"{host}:{port}/{database}")
    older = [written] + ([_folder_name(f"{host}/{database}")]
                         if port == pg_default_port() else [])
    return next((folders / n for n in older if (folders / n).is_dir()), folders / named)


def _folder_name(where: str) -> str:
    """A folder name for ``host:port/database`` (anything but letters, digits, '.', '-'
    and '_' becomes '_')."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", where).strip("_") or "default"


def folder(text: str) -> str:
    """An argparse type: a folder path that is not empty. An empty one (an unset variable,
    ``--data-dir "$DIR"``) meant the current directory to ``kinbox peers`` and the default
    folder to a runtime: two device keys for one database."""
    if not text.strip():
        raise argparse.ArgumentTypeError("give a folder; an empty path names none")
    return text


def add_data_dir_flag(parser: argparse.ArgumentParser) -> None:
    """``--data-dir`` for a command that opens a runtime or its device key."""
    parser.add_argument("--data-dir", metavar="PATH", type=folder,
                        help="folder of the device key and Focal's files (default: beside a "
                             "SQLite file; for a server database, one of the data directory "
                             "named for it); processes sharing a database that carry peer "
                             "messages need the same device key")


def resolve_data_dir(url: str, data_dir: str | os.PathLike[str] | None = None) -> Path:
    """The runtime's data folder: ``data_dir``, else :func:`data_dir_for` the database."""
    return Path(data_dir) if data_dir is not None else data_dir_for(url)
