"""The tool schemas a model sees tell the truth: valid JSON Schema, the real parameters of
each tool, only the tools the caller holds, and ``call`` runs them with the same rules."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import jsonschema
import pytest

from kinbox.actors import Runtime
from kinbox.actors.tool_schemas import TOOLS, parameters

from .helpers import quiet_brain

MakeRuntime = Callable[..., Runtime]


@pytest.fixture
def rt(make_runtime: MakeRuntime) -> Runtime:
    return make_runtime(brain=quiet_brain)


def sessions(rt: Runtime) -> dict[str, str]:
    project = rt.create_project("s")
    lead = rt.create_session(project.id, "Lead").id
    return {"lead": lead, "peer": rt.create_session(project.id, "Peer").id,
            "child": rt.create_session(project.id, "Kid", kind="subagent", parent_id=lead).id,
            "focal": rt.get_or_create_focal_chat().id}


def test_each_caller_sees_exactly_the_tools_it_holds(rt: Runtime) -> None:
    s = sessions(rt)

    def names(sid: str) -> list[str]:
        return [x["function"]["name"] for x in rt.tools_for(sid).schemas()]

    assert names(s["lead"]) == ["agent_list", "agent_read", "agent_send", "agent_stop", "agent",
                                "list_agents", "send", "task_create", "task_update",
                                "task_list"]
    # FO2: Focal dispatches work and never does it itself.
    assert names(s["focal"]) == ["agent_list", "agent_read", "agent_send", "agent_stop",
                                 "schedule_wakeup"]
    assert names(s["child"]) == ["list_agents", "send", "task_create", "task_update",
                                 "task_list"]
    focal_send = next(x for x in rt.tools_for(s["focal"]).schemas()
                      if x["function"]["name"] == "agent_send")
    assert {"project_id", "title", "task_title"} <= set(
        focal_send["function"]["parameters"]["properties"])


@pytest.mark.parametrize("shape", ["openai", "mcp"])
def test_every_schema_is_valid_json_schema_and_matches_the_real_signature(
        rt: Runtime, shape: str) -> None:
    s = sessions(rt)
    tools = rt.tools_for(s["focal"])
    for schema in tools.schemas(shape):
        name = schema["function"]["name"] if shape == "openai" else schema["name"]
        params = (schema["function"]["parameters"] if shape == "openai"
                  else schema["inputSchema"])
        jsonschema.Draft202012Validator.check_schema(params)
        signature = inspect.signature(getattr(tools, name))
        real = {p.name: p for p in signature.parameters.values()
                if p.kind is not inspect.Parameter.VAR_KEYWORD}
        documented = set(params["properties"])
        if name == "agent_send":  # Focal's extras arrive through **focal_args
            documented -= {"project_id", "title", "task_title"}
        assert documented == set(real), name
        required = {n for n, p in real.items() if p.default is inspect.Parameter.empty}
        assert set(params["required"]) == required, name


# Arguments the schema allows, and ones it forbids: the tool must agree with it.
ALLOWED: dict[str, dict[str, Any]] = {
    "agent_list": {"status": "active", "limit": 50},
    "agent_read": {"agent_id": "<peer>"},
    "task_create": {"title": "write it", "status": "in_progress"},
    "list_agents": {},
    "task_list": {},
}
FORBIDDEN: dict[str, dict[str, Any]] = {
    "agent_list": {"limit": 51},
    "agent_send": {"agent_id": "<peer>", "message": "x" * 20_001},
    "task_create": {"title": "t", "status": "blocked"},
    "agent": {"description": "d", "timeout": 0},
}


def _fill(args: dict[str, Any], s: dict[str, str]) -> dict[str, Any]:
    return {k: s["peer"] if v == "<peer>" else v for k, v in args.items()}


@pytest.mark.parametrize("name", sorted(ALLOWED))
def test_arguments_the_schema_allows_are_accepted_by_the_tool(rt: Runtime, name: str) -> None:
    s = sessions(rt)
    args = _fill(ALLOWED[name], s)
    jsonschema.validate(args, parameters(name))
    result = rt.tools_for(s["lead"]).call(name, args)
    assert "error" not in result, result


@pytest.mark.parametrize("name", sorted(FORBIDDEN))
def test_arguments_the_schema_forbids_are_refused_by_the_tool(rt: Runtime, name: str) -> None:
    s = sessions(rt)
    args = _fill(FORBIDDEN[name], s)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(args, parameters(name))
    assert rt.tools_for(s["lead"]).call(name, args)["error"] == "invalid_argument"
    assert rt.inbox() == []


def test_call_runs_a_model_tool_call_and_reports_refusals_as_dicts(rt: Runtime) -> None:
    s = sessions(rt)
    lead = rt.tools_for(s["lead"])
    sent = lead.call("agent_send", {"agent_id": s["peer"], "message": "hello"})
    assert sent["status"] == "pending" and rt.inbox()[0]["content"] == "hello"
    assert lead.call("agent_send", {"agent_id": s["lead"], "message": "me"})["error"] == \
        "invalid_argument"
    assert lead.call("rm_rf", {})["error"] == "not_found"
    assert lead.call("agent_read", {"agent_id": s["peer"], "extra": 1})["error"] == \
        "invalid_argument"
    assert lead.call("agent_read", ["not", "a", "dict"])["error"] == "invalid_argument"
    assert lead.call("agent_read", {})["error"] == "invalid_argument"
    odd = lead.call("agent_read", {1: 2, "agent_id": s["peer"]})
    assert odd == {"error": "invalid_argument",
                   "message": "agent_read's argument names must be strings, not 1."}
    assert rt.tools_for(s["child"]).call("agent_send", {"agent_id": s["peer"],
                                                        "message": "x"})["error"] == "not_found"
    assert len(rt.inbox()) == 1



def test_an_argument_to_a_tool_that_takes_none_is_refused_saying_so(rt: Runtime) -> None:
    """``task_list`` and ``list_agents`` take no arguments: a model that passes one
    (a filter it imagined) was told the tool "takes ." and nothing it could act on."""
    s = sessions(rt)
    lead = rt.tools_for(s["lead"])
    for name in ("task_list", "list_agents"):
        assert lead.call(name, {"status": "open"}) == {
            "error": "invalid_argument",
            "message": f"{name} has no argument 'status'; it takes no arguments."}
    assert lead.call("agent_read", {"agent": "x"})["message"] == (
        "agent_read has no argument 'agent'; it takes agent_id.")

def test_the_table_documents_every_tool_once() -> None:
    assert len(TOOLS) == 11
    assert all(description.endswith(".") for description, _, _ in TOOLS.values())


def _too_long(rt: Runtime, s: dict[str, str]) -> list[tuple[str, str, dict[str, Any]]]:
    """(caller, tool, arguments) one character past a limit the tool enforces."""
    p = rt.project("s")
    assert p is not None
    task = rt.tools_for(s["lead"]).task_create("t")["task_id"]
    new = {"agent_id": "new", "message": "go", "project_id": p.id, "title": "t"}
    return [
        ("lead", "task_update", {"task_id": task, "reason": "r" * 2_001}),
        ("lead", "task_update", {"task_id": "t" * 129, "status": "completed"}),
        ("lead", "agent_send", {"agent_id": "a" * 129, "message": "hi"}),
        ("lead", "agent_read", {"agent_id": "a" * 129}),
        ("lead", "agent_stop", {"agent_id": "a" * 129}),
        ("lead", "send", {"message": "all", "receiver_role": "b" * 16_385}),  # a broadcast
        ("focal", "agent_send", {**new, "title": "t" * 513}),
        ("focal", "agent_send", {**new, "task_title": "t" * 513}),
        ("focal", "agent_send", {**new, "project_id": "p" * 129}),
        ("focal", "schedule_wakeup", {"kind": "reminder", "at": 4e9, "note": "n" * 2_001}),
        ("focal", "schedule_wakeup", {"kind": "check", "cron": "0 " * 300}),
    ]


def test_every_limit_a_tool_enforces_is_in_its_schema(rt: Runtime) -> None:
    """The schemas left out the limits of task_update's reason, Focal's title, task_title
    and project_id, schedule_wakeup's note and cron, and every id: a model kept to its
    schema still met refusals the schema never told it about."""
    s = sessions(rt)
    for caller, name, args in _too_long(rt, s):
        tools = rt.tools_for(s[caller])
        schema = next(x["function"]["parameters"] for x in tools.schemas()
                      if x["function"]["name"] == name)
        assert tools.call(name, args)["error"] == "invalid_argument", (name, list(args))
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(args, schema)
    assert [r["target_chat_id"] for r in rt.inbox()] == []


def test_the_wake_up_schema_says_its_times_are_utc() -> None:
    """A wake-up's cron expression runs in UTC and an ISO time without an offset is UTC;
    the schema said neither, so a model asked for a 9 o'clock reminder set it for 09:00
    UTC, hours off for most of its users."""
    props = parameters("schedule_wakeup", focal=True)["properties"]
    assert "UTC" in props["cron"]["description"]
    assert "UTC" in props["at"]["description"]


@pytest.mark.timeout(60)
def test_an_integer_sent_as_a_whole_float_is_taken_as_the_schema_says(rt: Runtime) -> None:
    """JSON Schema's ``integer`` is any number with no fraction, so 5.0 is one; some
    models' tool calls carry every number as a float (a JSON ``5.0``, a protobuf
    Struct's double). The tools refused them ("not float"): a call its schema allows
    failed, and the model could not tell what to change."""
    s = sessions(rt)
    tools = rt.tools_for(s["lead"])
    for name, args in (("agent_list", {"limit": 1.0}),
                       ("agent", {"description": "d", "timeout": 30.0})):
        jsonschema.validate(args, parameters(name))
        result = tools.call(name, args)
        assert "error" not in result, (name, result)
    assert len(tools.agent_list(limit=1.0)["agents"]) == 1
    for bad in (1.5, float("nan"), float("inf"), True):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate({"limit": bad}, parameters("agent_list"))
        assert tools.call("agent_list", {"limit": bad})["error"] == "invalid_argument"
