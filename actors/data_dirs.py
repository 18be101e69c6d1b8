"""Where a runtime keeps files beside its database (Focal's heartbeat.md, the device key).

One folder per database: next to a SQLite file, or under the data directory
for a server database, so two PostgreSQL databases never share one.
"""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path

from ..persistence import default_data_dir, sqlite_path


def data_dir_for(url: str) -> Path:
    """The files folder of a runtime on ``url``.

    Beside a SQLite file (``<dir>/kinbox-data``); for a server database, a
    folder of the data directory named for host, port and database.
    """
    path = sqlite_path(url)
    if path is not None:
        return path.parent / "kinbox-data"
    rest = url.partition("://")[2].split("?", 1)[0]  # the query may hold '@' (a password)
    where = rest.rpartition("@")[2]
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", where).strip("_") or "default"
    return default_data_dir() / "databases" / name


def add_data_dir_flag(parser: argparse.ArgumentParser) -> None:
    """``--data-dir`` for a command that opens a runtime or its device key."""
    parser.add_argument("--data-dir", metavar="PATH",
                        help="folder of the device key and Focal's files (default: beside a "
                             "SQLite file; for a server database, one of the data directory "
                             "named for it); processes sharing a database that carry peer "
                             "messages need the same device key")


def resolve_data_dir(url: str, data_dir: str | os.PathLike[str] | None = None) -> Path:
    """The runtime's data folder: ``data_dir``, else :func:`data_dir_for` the database."""
    return Path(data_dir) if data_dir is not None else data_dir_for(url)
