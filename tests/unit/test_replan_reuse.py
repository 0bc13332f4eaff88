"""Re-plans revise only the implicated work (HEELO's COMPOSE, enforced by heart.ledger): a
call that succeeded and passed is not executed again in its turn, a state-changing call
that succeeded is never executed twice in its turn, a read after a state change runs again."""

import pytest
from fakes import PASS, HashingEmbedder, Script, dispatch, echo_bindings, fail, plan

from heart.calls import EpisodeContext, RoleClient
from heart.ledger import COUNTERS, TurnLedger, audit_trace
from heart.loop import HeartLoop, LoopConfig
from heart.runtime import ScriptedBackend
from heart.toolface import Tool, ToolFace, ToolSpec
from heart.traces import EpisodeRecord, TraceWriter, read_trace


class Bank:
    """A read (get_balance), two state-changing tools (send_money, touch) and ls; every
    execution is logged."""

    def __init__(self):
        self.balance, self.files, self.log = 100, [], []

    def tools(self):
        def get_balance():
            self.log.append("get_balance")
            return {"balance": self.balance}

        def send_money(recipient: str, amount: int):
            self.log.append(f"send_money:{recipient}:{amount}")
            self.balance -= amount
            return {"sent": amount, "to": recipient}

        def touch(file_name: str):
            self.log.append(f"touch:{file_name}")
            self.files.append(file_name)
            return {"created": file_name}

        def ls():
            self.log.append("ls")
            return {"files": sorted(self.files)}

        string, integer = {"type": "string"}, {"type": "integer"}
        specs = [(get_balance, "Get the account balance.", {}),
                 (send_money, "Send money to a recipient.", {"recipient": string, "amount": integer}),
                 (touch, "Create an empty file.", {"file_name": string}),
                 (ls, "List the files.", {})]
        return [Tool(ToolSpec(fn.__name__, doc, {"type": "object", "properties": props, "required": list(props)}),
                     fn) for fn, doc, props in specs]


@pytest.fixture
def bank(tmp_path):
    world = Bank()
    return world, ToolFace(world.tools(), cache_dir=tmp_path / "cache", embedder=HashingEmbedder()), tmp_path


def solve(script, toolface, path, query="pay bob", **config):
    with TraceWriter(path / "trace.jsonl", fsync=False) as trace:
        client = RoleClient(ScriptedBackend(script), EpisodeContext("ep", "task", "test"), trace)
        result = HeartLoop(client, toolface, lambda q: "", LoopConfig(**config)).solve(query)
    return result, list(read_trace(path / "trace.jsonl"))


def replanned(*steps):
    return lambda p: plan(*steps, replanned=bool(p.get("feedback")))


def test_a_replan_keeps_passed_steps_instead_of_running_them_again(bank):
    world, toolface, path = bank
    amounts = iter(["fifty", 50])  # the first send does not bind (nothing ran): FAIL, re-plan
    script = Script(
        planner=[replanned(("get_balance", "read balance"), ("send_money", "pay bob", [1]))],
        router=[lambda p: dispatch(("get_balance", {}), ("send_money", {"recipient": "bob", "amount": next(amounts)}))],
        primitive=[echo_bindings],
        verifier=[PASS, fail("Step 2 (send_money): amount 'fifty' is not an integer."), PASS])
    result, rows = solve(script, toolface, path, replan_budget=1)
    assert result.verdict == "PASS" and len(result.attempts) == 2
    # the passed read ran once; the re-plan's step 1 got its envelope, marked, and no new verdict
    assert world.log == ["get_balance", "send_money:bob:50"]
    kept = result.attempts[1].results[1]
    assert kept.reused and kept.meta["reused"] == {"attempt": 0, "step": 1, "passed": True}
    assert kept.result == result.attempts[0].results[1].result and kept.meta["attempts"] == 0
    verified = [(p["steps"][0]["step"]) for role, p in script.calls if role == "verifier"]
    assert verified == [1, 2, 2]  # attempt 1's step 1 is not judged again
    assert result.counts == {"reused_steps": 1, "passed_steps_reexecuted": 0, "state_changing_executed_twice": 0}
    # the Planner's executed_so_far lists what ran, once; the answer quotes the balance once
    last_planner = [p for role, p in script.calls if role == "planner"][-1]
    assert [e["tool"] for e in last_planner["executed_so_far"]] == ["get_balance", "send_money"]
    assert result.response.count("get_balance:") == 1
    # the trace records the reuse on the Primitive event: the audit sees no re-execution
    primitive_events = [r for r in rows if r.get("role") == "primitive"]
    assert [bool(r["extra"]["envelope"]["meta"].get("reused")) for r in primitive_events] == [False, False, True, False]
    audit = audit_trace(rows)
    assert {k: audit[k] for k in COUNTERS} == result.counts


def test_a_state_changing_call_that_succeeded_never_runs_twice_in_a_turn(bank):
    world, toolface, path = bank
    # the Verifier fails the payment (not on how it was called): the re-plan repeats it,
    # then adds the step that was missing
    not_done = fail("Step 1 (send_money): ran; the request also wants the file.")
    script = Script(
        planner=[plan(("send_money", "pay bob")),
                 plan(("send_money", "pay bob"), ("touch", "write receipt", [1]), replanned=True)],
        router=[dispatch(("send_money", {"recipient": "bob", "amount": 50})),
                dispatch(("send_money", {"recipient": "bob", "amount": 50}), ("touch", {"file_name": "receipt"}))],
        primitive=[echo_bindings], verifier=[not_done, PASS])
    result, rows = solve(script, toolface, path, replan_budget=1)
    assert world.log == ["send_money:bob:50", "touch:receipt"] and world.balance == 50
    kept = result.attempts[1].results[1]
    assert kept.reused and kept.meta["reused"]["passed"] is False
    # a reused envelope the Verifier had failed is judged again, and its input says it was reused
    judged = [p["steps"][0] for role, p in script.calls if role == "verifier"]
    assert [s["step"] for s in judged] == [1, 1, 2]
    assert judged[1]["envelope"]["meta"]["reused"] == {"attempt": 0, "step": 1, "passed": False}
    assert result.verdict == "PASS" and result.counts["reused_steps"] == 1
    assert result.counts["state_changing_executed_twice"] == 0


def test_the_same_state_changing_call_twice_in_one_plan_runs_once(bank):
    world, toolface, path = bank
    script = Script(planner=[plan(("touch", "create a"), ("touch", "create a again"))],
                    router=[dispatch(("touch", {"file_name": "a"}), ("touch", {"file_name": "a"}))],
                    primitive=[echo_bindings], verifier=[PASS])
    result, _ = solve(script, toolface, path)
    assert world.log == ["touch:a"] and result.attempts[0].results[2].reused
    assert result.counts == {"reused_steps": 1, "passed_steps_reexecuted": 0, "state_changing_executed_twice": 0}


def test_a_read_after_a_state_change_runs_again(bank):
    world, toolface, path = bank
    script = Script(planner=[plan(("ls", "list"), ("touch", "create a", [1]), ("ls", "list again", [2]))],
                    router=[dispatch(("ls", {}), ("touch", {"file_name": "a"}), ("ls", {}))],
                    primitive=[echo_bindings], verifier=[PASS])
    result, _ = solve(script, toolface, path)
    assert world.log == ["ls", "touch:a", "ls"]
    assert result.attempts[0].results[3].result == {"files": ["a"]} and not result.attempts[0].results[3].reused
    assert result.counts["reused_steps"] == 0


def test_whole_attempt_verification_still_runs_a_state_changing_call_once(bank):
    world, toolface, path = bank
    script = Script(planner=[replanned(("send_money", "pay bob"))],
                    router=[dispatch(("send_money", {"recipient": "bob", "amount": 50}))],
                    primitive=[echo_bindings], verifier=[fail("not yet"), PASS])
    result, _ = solve(script, toolface, path, verify="attempt", replan_budget=1)
    assert world.log == ["send_money:bob:50"] and result.attempts[1].results[1].reused


def test_the_audit_counts_repeats_in_a_trace_of_a_loop_without_the_ledger():
    """A trace as the loop wrote it before the ledger: a passed read and a payment re-run by
    the re-plan. The audit reads them from the Primitive and Verifier events."""
    def primitive(attempt, step, tool, arguments):
        return {"kind": "event", "episode_id": "e", "turn": 0, "attempt": attempt, "step": step, "role": "primitive",
                "extra": {"envelope": {"status": "SUCCESS", "tool": tool, "bound_arguments": arguments, "meta": {}}}}

    def verdict(attempt, step, status):
        return {"kind": "event", "episode_id": "e", "turn": 0, "attempt": attempt, "step": step, "role": "verifier",
                "parsed": {"step": step, "status": status}}

    pay = {"recipient": "bob", "amount": 50}
    rows = [primitive(0, 1, "get_balance", {}), verdict(0, 1, "PASS"),
            primitive(0, 2, "send_money", pay), verdict(0, 2, "FAIL"),
            primitive(1, 1, "get_balance", {}), verdict(1, 1, "PASS"),  # stale: send_money ran since
            primitive(1, 2, "send_money", pay), verdict(1, 2, "PASS"),
            primitive(2, 1, "send_money", pay)]
    audit = audit_trace(rows)
    assert audit["state_changing_executed_twice"] == 2 and audit["passed_steps_reexecuted"] == 1
    assert audit["episodes_with_repeats"] == ["e"]


def test_the_ledger_reuses_by_bound_arguments_and_the_record_carries_its_counters():
    ledger = TurnLedger()
    ledger.ran("send_money", {"amount": 5, "recipient": "bob"}, 0, 1, "SUCCESS")
    assert ledger.reusable("send_money", {"recipient": "bob", "amount": 5}) is not None  # key order is not identity
    assert ledger.reusable("send_money", {"recipient": "bob", "amount": 6}) is None
    ledger.ran("send_money", {"amount": 7, "recipient": "bob"}, 0, 2, "FAILURE", "CONSTRAINT_VIOLATION")
    assert ledger.reusable("send_money", {"amount": 7, "recipient": "bob"}) is None  # never reached the tool
    record = EpisodeRecord(episode_id="e", task_id="t", env="x", score=1.0, success=True, verdicts=[], replans_used=[])
    assert all(getattr(record, name) == 0 for name in COUNTERS)


def test_the_read_only_rule_reads_camel_case_and_object_get_names():
    from heart.roles.router import is_read_only

    assert is_read_only("displayCarStatus") and is_read_only("ticket_get_login_status") and is_read_only("ls")
    assert not any(map(is_read_only, ("send_money", "startEngine", "mkdir", "create_file", "cd", "echo")))
