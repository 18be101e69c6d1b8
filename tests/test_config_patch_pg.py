"""Two processes patching one session's config at once both keep their keys (PostgreSQL):
the merge read the row unlocked, so the second commit wrote back the config as it was
before the first (the Focal heartbeat setting, a check-in's signature, ``focal_watching``
on one row)."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest

from kinbox.persistence import sessions

from .conftest import Stores

pytestmark = pytest.mark.postgres


@pytest.mark.timeout(60)
def test_two_processes_patching_one_config_at_once_both_keep_their_keys(
        pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first patch has read the config and not written it yet when the second runs
    whole; forced by a hook in the first's read (the second, locked out, gets 2 s)."""
    one, two = Stores(pg_url), Stores(pg_url)
    try:
        one.store.create_session("s", None, "t", "interactive", 1.0, config={"kept": True})
        second_done = threading.Event()
        first_thread: list[threading.Thread] = []

        def second() -> None:
            two.store.patch_config("s", {"second": 2}, 3.0)
            second_done.set()

        class Hooked:
            @staticmethod
            def loads(text: str) -> Any:
                if threading.current_thread() in first_thread and not second_done.is_set() \
                        and not getattr(Hooked, "ran", False):
                    Hooked.ran = True  # type: ignore[attr-defined]
                    runner = threading.Thread(target=second)
                    runner.start()
                    second_done.wait(2)  # with the row locked, it waits for our commit
                return json.loads(text)

            dumps = staticmethod(json.dumps)

        monkeypatch.setattr(sessions, "json", Hooked)
        first_thread.append(one.writer._thread)  # type: ignore[attr-defined]
        one.store.patch_config("s", {"first": 1}, 2.0)
        assert second_done.wait(10)
        config = one.store.session("s").config  # type: ignore[union-attr]
        assert config == {"kept": True, "first": 1, "second": 2}
    finally:
        one.close()
        two.close()
