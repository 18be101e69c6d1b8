"""Forged paging input is refused as InvalidArgument (ConfigError from the runtime, exit 2
from the CLI), never as whatever error the conversion or the driver raised.

A cursor is user input (base64 of JSON): a time that is a JSON integer too large for a
float raised ``OverflowError`` (which neither the CLI's argparse type nor the runtime turned
into a refusal), and an id holding a NUL reached PostgreSQL, which takes none in a text
parameter (SQLite read it). A limit of more than 4,300 digits made the error's own message
fail (Python refuses to print such an int).
"""

from __future__ import annotations

import base64
import io

import pytest

from kinbox.actors import ConfigError, Runtime
from kinbox.actors.cli import main
from kinbox.persistence import InvalidArgument, KinboxError, paging

from .conftest import Stores

pytestmark = pytest.mark.timeout(60)


def token(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


HUGE_TIME = token("[" + "9" * 400 + ',"s00"]')
"""Well under CURSOR_LIMIT (1000 characters), a valid JSON pair: a number and a string."""
NUL_ID = token('[1.0,"s\\u0000x"]')


def test_a_cursor_whose_time_overflows_a_float_is_invalid_argument() -> None:
    assert len(HUGE_TIME) <= paging.CURSOR_LIMIT
    with pytest.raises(InvalidArgument) as caught:
        paging.keyset(HUGE_TIME)
    assert caught.value.field == "after"


def test_the_runtime_refuses_an_overflowing_cursor_as_config_error(db_url: str) -> None:
    rt = Runtime(db=db_url)
    rt.start()
    try:
        with pytest.raises(ConfigError) as caught:
            rt.sessions_page(after=HUGE_TIME)
        assert caught.value.field == "after"
    finally:
        rt.stop()


def test_sessions_list_refuses_an_overflowing_cursor_as_a_usage_error(db_url: str) -> None:
    Runtime(db=db_url).start().stop()  # the schema
    with pytest.raises(SystemExit) as caught:
        main(["sessions", "list", "--db", db_url, "--after", HUGE_TIME], out=io.StringIO())
    assert caught.value.code == 2


def test_a_cursor_with_a_nul_in_its_id_is_refused_on_both_backends(stores: Stores) -> None:
    """Either refused as an argument or read as a position no session has; not a driver
    error that differs by backend (SQLite reads it, PostgreSQL's driver raises a bare
    ValueError)."""
    try:
        page = stores.store.sessions_page(limit=5, after=NUL_ID)
    except InvalidArgument as exc:
        assert exc.field == "after"
    except KinboxError as exc:  # pragma: no cover - what the backends would differ on
        pytest.fail(f"a forged cursor failed in the database: {exc!r}")
    else:
        assert page.sessions == [] and page.after is None



@pytest.mark.parametrize("forged", [paging.Keyset(1.0, "s\x00x"), paging.Keyset(1.0, "\ud800"),
                                    paging.Keyset("x", "s"),  # type: ignore[arg-type]
                                    paging.Keyset(float("nan"), "s"),
                                    paging.Keyset(1.0, "s" * 129)])
def test_a_keyset_built_by_hand_is_checked_as_its_token_is(stores: Stores,
                                                            forged: paging.Keyset) -> None:
    """``after`` takes a :class:`paging.Keyset` as well as its token, and a Keyset is a
    plain tuple anyone can build: it went to the SQL unchecked, so an id with a NUL or a
    time that is no number failed in PostgreSQL's driver (a DataError) and SQLite read a
    page from wherever its comparison put it. The rule of the token holds for both."""
    with pytest.raises(InvalidArgument) as caught:
        stores.store.sessions_page(limit=5, after=forged)
    assert caught.value.field == "after"


def test_a_limit_too_long_to_print_is_invalid_argument_not_a_conversion_error(
        db_url: str) -> None:
    """``InvalidArgument.__init__`` quotes ``repr(value)``: for an int of more than 4,300
    digits Python 3.11 refuses that conversion, and the refusal escapes as a bare
    ValueError from inside the error's constructor (the runtime then raises no
    ConfigError either)."""
    huge = 10**5000
    with pytest.raises(InvalidArgument) as caught:
        paging.limit(huge)
    assert caught.value.field == "limit" and caught.value.value == huge
    rt = Runtime(db=db_url)
    rt.start()
    try:
        with pytest.raises(ConfigError):
            rt.sessions(limit=huge)
    finally:
        rt.stop()
