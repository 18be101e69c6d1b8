"""``CronStore.create`` on both backends: an add that repeats an idempotency key answers the
job that key added; every other refusal of the row is an error, and nothing is written.

The insert ignored every conflict: on SQLite ``INSERT OR IGNORE`` passes over a NOT NULL
or CHECK violation too, so a row the table refused was answered as a duplicate id (or,
with a key, looked up by it) instead of as the refusal it was."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kinbox.persistence import CronJobRecord, CronStore, DatabaseFailed, DuplicateError

from .conftest import Stores


def job(job_id: str, key: str | None = None, **changes: object) -> CronJobRecord:
    record = CronJobRecord(job_id, "digest", "0 9 * * *", "UTC", "Summarize", True, "announce",
                           0, 100.0, None, None, None, 1.0, 1.0, idempotency_key=key)
    return replace(record, **changes)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("key", [None, "k-1"])
def test_a_row_the_table_refuses_is_an_error_not_a_duplicate(stores: Stores,
                                                            key: str | None) -> None:
    cron = CronStore(stores.tables, stores.writer)
    wrote: list[str] = []
    with pytest.raises(DatabaseFailed) as refused:
        cron.create(job("cj_1", key, prompt=None), also=lambda: wrote.append("session"))
    assert not isinstance(refused.value, DuplicateError)
    assert refused.value.kind == "IntegrityError"
    assert (cron.jobs(), wrote) == ([], [])


@pytest.mark.timeout(60)
def test_a_repeated_key_answers_its_job_and_a_taken_id_is_a_duplicate(stores: Stores) -> None:
    cron = CronStore(stores.tables, stores.writer)
    first = cron.create(job("cj_1", "k-1"))
    assert cron.create(job("cj_2", "k-1", name="other")) == first  # the key's job
    assert cron.create(job("cj_1", "k-1")) == first  # the same request again
    with pytest.raises(DuplicateError) as taken:
        cron.create(job("cj_1", "k-2"))
    assert (taken.value.field, taken.value.value) == ("id", "cj_1")
    with pytest.raises(DuplicateError):
        cron.create(job("cj_1"))
    assert [j.id for j in cron.jobs()] == ["cj_1"]
