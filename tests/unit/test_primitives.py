"""Binding against schemas, execution envelopes, timeouts and $step references."""

import threading
import time

import pytest

from heart.environments.base import ToolExecutionError
from heart.primitives import (CONSTRAINT_VIOLATION, RUNTIME_ERROR, SCHEMA_RESOLUTION, BindingError, Envelope,
                              bind_arguments, execute, resolve_references)
from heart.toolface import Tool, ToolSpec

SCHEMA = {
    "type": "object",
    "properties": {
        "count": {"type": "integer", "minimum": 1},
        "price": {"type": "number"},
        "urgent": {"type": "boolean"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "tags": {"type": "array", "items": {"type": "string"}},
        "name": {"type": "string"},
        "mode": {"type": "string", "default": "auto"},
    },
    "required": ["count", "name"],
}


def test_coerces_types_from_strings():
    bound = bind_arguments({"count": "3", "price": "2.5", "urgent": "yes", "tags": "a", "name": 7}, SCHEMA)
    assert bound == {"count": 3, "price": 2.5, "urgent": True, "tags": ["a"], "name": "7"}


def test_matches_enums_case_insensitively_and_rejects_others():
    assert bind_arguments({"count": 1, "name": "x", "unit": "Celsius"}, SCHEMA)["unit"] == "celsius"
    with pytest.raises(BindingError) as err:
        bind_arguments({"count": 1, "name": "x", "unit": "kelvin"}, SCHEMA)
    assert err.value.failure_type == CONSTRAINT_VIOLATION


def test_enums_on_array_items_are_matched_per_item():
    schema = {"type": "object", "properties": {"doors": {"type": "array", "items": {"type": "string",
                                                                                    "enum": ["driver", "rear_left"]}}}}
    assert bind_arguments({"doors": ["Driver", "rear_left"]}, schema) == {"doors": ["driver", "rear_left"]}
    with pytest.raises(BindingError) as err:
        bind_arguments({"doors": ["driver", "trunk"]}, schema)
    assert err.value.failure_type == CONSTRAINT_VIOLATION and "doors[1]" in err.value.details


def test_missing_required_and_unknown_parameters_are_schema_failures():
    with pytest.raises(BindingError) as err:
        bind_arguments({"count": 1}, SCHEMA)
    assert err.value.failure_type == SCHEMA_RESOLUTION and "'name'" in err.value.details
    with pytest.raises(BindingError) as err:
        bind_arguments({"count": 1, "name": "x", "colour": "red"}, SCHEMA)
    assert err.value.failure_type == SCHEMA_RESOLUTION and "colour" in err.value.details


def test_uncoercible_value_is_a_schema_failure_and_range_a_constraint_failure():
    with pytest.raises(BindingError) as err:
        bind_arguments({"count": "many", "name": "x"}, SCHEMA)
    assert err.value.failure_type == SCHEMA_RESOLUTION
    with pytest.raises(BindingError) as err:
        bind_arguments({"count": 0, "name": "x"}, SCHEMA)
    assert err.value.failure_type == CONSTRAINT_VIOLATION and "count" in err.value.details


def test_defaults_fill_only_what_the_function_does_not_default_itself():
    def needs_mode(count, name, mode):
        return mode

    def defaults_mode(count, name, mode="python-default"):
        return mode

    assert bind_arguments({"count": 1, "name": "x"}, SCHEMA, needs_mode)["mode"] == "auto"
    assert "mode" not in bind_arguments({"count": 1, "name": "x"}, SCHEMA, defaults_mode)


def tool(fn, schema=SCHEMA, name="t"):
    return Tool(ToolSpec(name, "a test tool", schema), fn)


def test_execute_success_envelope():
    env = execute(tool(lambda count, name: {"made": count}), {"count": "2", "name": "n"})
    assert env.ok and env.result == {"made": 2} and env.bound_arguments == {"count": 2, "name": "n"}
    assert env.to_dict()["status"] == "SUCCESS" and "failure_type" not in env.to_dict()


def test_execute_reports_tool_errors_and_exceptions_as_runtime_failures():
    def broken(count, name):
        raise ToolExecutionError("cd: no such folder")

    env = execute(tool(broken), {"count": 1, "name": "x"})
    assert not env.ok and env.failure_type == RUNTIME_ERROR and "no such folder" in env.details
    env = execute(tool(lambda count, name: 1 / 0), {"count": 1, "name": "x"})
    assert env.failure_type == RUNTIME_ERROR and "ZeroDivisionError" in env.details


def test_execute_times_out():
    """The envelope comes back while the tool is still running (no wall-clock bound: the tool
    runs 25 times the timeout, so only a missing timeout lets it finish first)."""
    finished = threading.Event()

    def slow(count, name):
        time.sleep(5)
        finished.set()

    env = execute(tool(slow), {"count": 1, "name": "x"}, timeout_s=0.2)
    assert env.failure_type == RUNTIME_ERROR and "timed out" in env.details
    assert not finished.is_set()


def test_references_resolve_into_results_and_envelopes():
    results = {1: Envelope("SUCCESS", "ls", {"a": True}, result={"files": ["x.txt", "y.txt"], "n": 2}, summary="2")}
    bound = resolve_references({"f": "$step_1.files.1", "n": "$step_1.n", "all": "$step_1",
                                "arg": "$step_1.bound_arguments.a", "text": "there are $step_1.n files",
                                "nested": ["$step_1.files.0"]}, results)
    assert bound == {"f": "y.txt", "n": 2, "all": {"files": ["x.txt", "y.txt"], "n": 2}, "arg": True,
                     "text": "there are 2 files", "nested": ["x.txt"]}


@pytest.mark.parametrize("ref", ["$step_2.files", "$step_1.missing", "$step_3"])
def test_unresolvable_references_fail_with_schema_resolution(ref):
    results = {1: Envelope("SUCCESS", "ls", result={"files": []}),
               3: Envelope("FAILURE", "cd", failure_type=RUNTIME_ERROR)}
    with pytest.raises(BindingError) as err:
        resolve_references({"x": ref}, results)
    assert err.value.failure_type == SCHEMA_RESOLUTION
