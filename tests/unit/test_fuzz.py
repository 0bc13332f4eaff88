"""A fast sample of bench/fuzz.py: malformed and adversarial outputs through every role
parser and through the loop end in a typed failure or a valid value — no exception, no hang.

The full run (≥ 10,000 cases per role) is ``python bench/fuzz.py``.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, Phase, given, settings

from bench.fuzz import (check_parse, from_schema, loop_outputs, outputs_for, roles_under_test,
                        run_loop_case)

SAMPLE = settings(max_examples=150, database=None, deadline=None, phases=[Phase.generate],
                  suppress_health_check=list(HealthCheck))
ROLES = {role.name: role for role in roles_under_test()}


@pytest.mark.parametrize("name", sorted(ROLES))
def test_every_output_is_a_typed_failure_or_a_valid_value(name):
    role = ROLES[name]

    @SAMPLE
    @given(outputs_for(role))
    def check(text):
        outcome, detail, _ = check_parse(role, text)
        assert outcome in ("valid", "typed_failure"), f"{outcome}: {detail} on {text[:300]!r}"

    check()


@pytest.mark.parametrize("name", sorted(ROLES))
def test_schema_valid_answers_parse(name):
    """The generator's valid answers are valid to the parser too (or rejected with a reason
    the schema cannot express, e.g. a dependency on a later step): the fuzz is on target."""
    role = ROLES[name]
    outcomes = []

    @SAMPLE
    @given(from_schema(role.schema))
    def check(value):
        import json

        outcomes.append(check_parse(role, json.dumps(value))[0])

    check()
    assert outcomes.count("valid") >= 0.5 * len(outcomes), outcomes


def test_the_loop_survives_fuzzed_answers_from_every_role(tmp_path):
    @settings(max_examples=40, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(loop_outputs())
    def check(answers):
        outcome, detail = run_loop_case(answers, tmp_path / "cache", tmp_path / "trace.jsonl")
        assert outcome == "ok", f"{outcome}: {detail}"

    check()


@pytest.mark.parametrize("name", sorted(ROLES))
def test_nesting_past_the_decoders_limit_is_a_typed_failure(name):
    """Found by the fuzz: a deeply nested answer raised RecursionError out of the parser."""
    deep = 20_000
    for text in ("[" * deep + "]" * deep, '{"x": ' + "[" * deep + "]" * deep + "}", '{"a": ' * deep + "1" + "}" * deep):
        assert check_parse(ROLES[name], text)[0] == "typed_failure"
