"""A short password in a driver's error: masked wherever it is printed as the password,
and nowhere else (the text stays readable, and the masks do not spell it out). Each test
failed on the code before its fix."""

from __future__ import annotations

import pytest

from kinbox.persistence import redact_text, redact_url

pytestmark = pytest.mark.timeout(30)

SHORT = ["a", "pg", "x1", "é", "a b", "se%"]

# Where a driver or a URL prints the password: quoted, in a URL's userinfo, as a keyword's
# value, alone at either end.
AS_THE_PASSWORD = [
    'invalid percent-encoded token: "{p}"',
    "invalid choice: 'postgresql://me:{p}@127.0.0.1/db'",
    "host=127.0.0.1 password={p} dbname=db",
    "{p}",
    "password: {p}",
]


@pytest.mark.parametrize("password", SHORT)
@pytest.mark.parametrize("said", AS_THE_PASSWORD)
def test_a_short_password_is_masked_wherever_it_is_printed_as_the_password(
    password: str, said: str
) -> None:
    url = f"postgresql://me:{password}@127.0.0.1/db"
    assert redact_text(said.format(p=password), url) == said.format(p="***")


@pytest.mark.parametrize(
    ("password", "said"),
    [
        ("a", 'connection to server at "127.0.0.1", port 5432 failed: cannot open database'),
        ("pg", 'FATAL:  database "pgdb" does not exist (see pg_hba.conf, user pgadmin)'),
        ("x1", "could not translate host name x1x1.example to address"),
    ],
)
def test_a_short_password_inside_words_is_left_there(password: str, said: str) -> None:
    """The password ``a`` replaced every 'a' of the error (``c***nnot ***pen
    d***t***b***se``): unreadable, and the masks told the password to whoever read it."""
    url = f"postgresql://me:{password}@127.0.0.1/db"
    assert redact_text(said, url) == said
    with_url = f"{said} for 'postgresql://me:{password}@127.0.0.1/db'"
    assert redact_text(with_url, url) == f"{said} for {redact_url(url)!r}"
    assert redact_url(url).endswith("me:***@127.0.0.1/db")


def test_a_long_password_is_masked_inside_words_too() -> None:
    url = "postgresql://me:Hunter2Hunter2@127.0.0.1/db"
    assert redact_text("token xHunter2Hunter2y", url) == "token x***y"


@pytest.mark.parametrize("url", ["postgresql://kbx:Sup3r/SecretPw@127.0.0.1:5432/x",
                                 "postgresql://kbx:Sup3r?SecretPw@127.0.0.1:5432/x",
                                 "postgresql://kbx:Sup3r#SecretPw@127.0.0.1:5432/x"])
def test_the_part_of_a_password_the_driver_reads_as_the_port_is_masked(url: str) -> None:
    """A '/', '?' or '#' unencoded in the password ends the URL's host part there: libpq
    reads the password's first part as the port and quotes it (``invalid integer value
    "Sup3r" for connection option "port"``); ``kinbox bench scaleout --db`` printed it."""
    said = 'invalid integer value "Sup3r" for connection option "port"'
    assert "Sup3r" not in redact_text(said, url)
    assert "Sup3r" not in redact_url(url)
