"""How much one page of a listing may hold, for the HTTP API and the commands alike.

A module of constants alone: the CLI's parsers name these limits in their help and
checks, and importing them from the HTTP module (:mod:`.cron_http`) brought Starlette
into every ``kinbox`` command.
"""

from __future__ import annotations

RUNS_LIMIT = 500
"""Most records one listing returns: run records (HTTP and ``rt.cron.runs``), jobs (HTTP
and ``rt.cron.jobs``)."""

__all__ = ["RUNS_LIMIT"]
