"""The group-commit writer: shared commits, per-operation undo, nothing half-written."""

from __future__ import annotations

import threading

import pytest

from kinbox.persistence import WriterClosed

from .conftest import Stores


def insert_project(s: Stores, pid: str) -> None:
    s.tables.project.insert(id=pid, slug=pid, name=pid, created_at=0).execute()


def test_a_failing_operation_undoes_only_its_own_writes(stores: Stores) -> None:
    gate = threading.Event()
    blocker = stores.writer.submit(lambda: gate.wait(10))  # holds the writer so a batch forms

    def half_then_fail() -> None:
        insert_project(stores, "half")
        raise ValueError("boom after a write")

    good = stores.writer.submit(lambda: insert_project(stores, "good"))
    bad = stores.writer.submit(half_then_fail)
    also_good = stores.writer.submit(lambda: insert_project(stores, "also-good"))
    gate.set()
    blocker.result(10)
    good.result(10)
    also_good.result(10)
    with pytest.raises(ValueError, match="boom after a write"):
        bad.result(10)
    slugs = {p.slug for p in stores.store.projects()}
    assert slugs == {"good", "also-good"}
    assert stores.writer.statistics().largest_batch >= 3


def test_a_result_means_other_connections_already_see_the_write(stores: Stores) -> None:
    stores.writer.call(lambda: insert_project(stores, "p1"))
    seen: list[bool] = []

    def look() -> None:  # its own thread, so its own connection
        seen.append(stores.tables.project.select().where(
            stores.tables.project.slug == "p1").exists())
        stores.db.close()

    reader = threading.Thread(target=look)
    reader.start()
    reader.join(10)
    assert seen == [True]


def test_a_stopped_writer_refuses_new_work(stores: Stores) -> None:
    stores.writer.stop()
    with pytest.raises(WriterClosed):
        stores.writer.submit(lambda: None)


def test_abort_refuses_what_was_queued(stores: Stores) -> None:
    gate, inside = threading.Event(), threading.Event()
    running = stores.writer.submit(lambda: (inside.set(), gate.wait(10)))
    assert inside.wait(10)  # the writer is busy with the first operation
    queued = stores.writer.submit(lambda: insert_project(stores, "never"))
    stores.writer.abort()
    gate.set()
    running.result(10)
    with pytest.raises(WriterClosed):
        queued.result(10)
    assert stores.store.projects() == []
