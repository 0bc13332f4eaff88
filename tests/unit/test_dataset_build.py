"""Traces → role datasets: which calls are kept, how they are labelled and split."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest

from heart_distill.data.build import BuildOptions, build_role_datasets, main, validation_tasks_by_fraction
from heart_distill.data.filters import balance_verdicts
from heart.environments.splits import split_of
from heart.roles import planner, primitive, router, verifier
from heart.roles.common import read_input, render_input
from heart.traces import EpisodeRecord, TraceEvent, TraceWriter

ENV = "toy"


def tasks_in(split: str, n: int) -> list[str]:
    found = [f"t{i}" for i in range(1000) if split_of(ENV, f"t{i}") == split]
    return found[:n]


TRAIN = tasks_in("train", 6)
DEV = tasks_in("dev", 2)
TEST = tasks_in("test", 1)


LS = {"type": "object", "properties": {"path": {"type": "string"}}}
INTENT = {"task": "t", "objective": "o", "tool_categories": ["fs"], "constraints": []}


def role_call(role: str, text: str, step: int | None, envelope_status: str = "SUCCESS") -> tuple[str, dict]:
    """A real role input (with ``text`` as its query or request) and a valid answer."""
    if role == "planner":
        payload = planner.build_payload(text, [{"name": "ls", "description": "List files.", "category": "fs"}])
        answer = {"status": "SUFFICIENT", "intent": INTENT, "replanned": False, "plan": [
            {"step": 1, "tool_category": "fs", "tool_hint": "ls", "objective": "list", "dependencies": []}]}
        return render_input(planner.INSTRUCTION, payload), answer
    if role == "router":
        payload = router.build_payload(text, [{"step": 1, "tool_hint": "ls", "objective": "list", "dependencies": []}],
                                       {"ls": router.tool_parameters(LS)})
        answer = {"status": "READY", "dispatch": [{"step": 1, "target_tool": "ls", "invocation_request": "list",
                                                   "resolved_bindings": {},
                                                   "h_params": {"retry": 1, "priority": "normal", "timeout_s": 30}}]}
        return render_input(router.INSTRUCTION, payload), answer
    if role == "primitive":
        payload = primitive.build_payload(text, {}, primitive.tool_card("ls", "List files.", LS))
        return render_input(primitive.INSTRUCTION, payload), {"tool": "ls", "arguments": {}}
    entry = verifier.step_entry({"step": step, "tool_hint": "ls", "objective": "list"}, "list", {},
                                {"status": envelope_status, "tool": "ls"}, LS)
    return render_input(verifier.INSTRUCTION, verifier.build_payload(text, INTENT, [entry])), {}


class Episode:
    """Writes the events of one episode the way the loop does (real role inputs), then its record."""

    def __init__(self, writer: TraceWriter, episode_id: str, task_id: str, teacher: str = "gold"):
        self.writer, self.episode_id, self.task_id, self.teacher = writer, episode_id, task_id, teacher

    def call(self, role: str, attempt: int, step: int | None = None, *, turn: int = 0,
             user: str | None = None, output: dict | None = None, parse_error: str | None = None,
             extra: dict | None = None, raw: str | None = None, envelope_status: str = "SUCCESS") -> None:
        text = user or f"{role} {self.task_id} turn {turn} attempt {attempt} step {step}"
        content, answer = role_call(role, text, step, envelope_status)
        output = output if output is not None else answer
        self.writer.write(TraceEvent(
            episode_id=self.episode_id, task_id=self.task_id, env=ENV, turn=turn,
            attempt=attempt, step=step, role=role, backend=self.teacher, adapter=None,
            messages=[{"role": "system", "content": f"You are the {role}."},
                      {"role": "user", "content": content}],
            raw_output=raw if raw is not None else json.dumps(output),
            parsed=None if parse_error else output, parse_error=parse_error,
            latency_s=0.01, prompt_tokens=5, completion_tokens=5, extra=extra or {},
        ))

    def primitive(self, attempt: int, step: int, status: str = "SUCCESS", **kw) -> None:
        extra = {"envelope": {"status": status, "failure_type": None if status == "SUCCESS"
                              else "RUNTIME_ERROR"}, **kw.pop("extra", {})}
        self.call("primitive", attempt, step, extra=extra, **kw)

    def verifier(self, attempt: int, verdict: str, envelope_status: str = "SUCCESS", **kw) -> None:
        criteria = dict.fromkeys(("task_completion", "argument_consistency", "execution_validity",
                                  "constraint_satisfaction"), "pass" if verdict == "PASS" else "fail")
        self.call("verifier", attempt, 0, envelope_status=envelope_status,
                  output={"status": verdict, "step": 0, "criteria": criteria,
                          "feedback": "" if verdict == "PASS" else f"FAIL for {self.task_id}"}, **kw)

    def attempt(self, attempt: int, verdict: str, primitive_status: str = "SUCCESS") -> None:
        user = (f"plan {self.task_id}" if attempt == 0
                else f"plan {self.task_id} again; verifier feedback: FAIL attempt {attempt - 1}")
        self.call("planner", attempt, user=user)
        self.call("router", attempt, 0)
        self.primitive(attempt, 0, primitive_status)
        self.verifier(attempt, verdict, primitive_status)

    def close(self, success: bool, verdicts: list[str] | None = None, checker: dict | None = None) -> None:
        self.writer.write(EpisodeRecord(
            episode_id=self.episode_id, task_id=self.task_id, env=ENV, score=float(success),
            success=success, verdicts=verdicts or ["PASS"], replans_used=[0], backend=self.teacher,
            checker=checker or {}))


def write_run(run_dir) -> None:
    """The hand-written run of the tests below (two shards, torn last line in one)."""
    with TraceWriter(run_dir / "traces" / "shard-0.jsonl", fsync=False) as w:
        # A: success after a re-plan; attempt 0's primitive failed
        a = Episode(w, "A", TRAIN[0])
        a.attempt(0, "FAIL", primitive_status="FAILURE")
        a.attempt(1, "PASS")
        a.close(True)
        # A2: the same task again, word for word: duplicates of A's attempt 1 (and attempt 0)
        a2 = Episode(w, "A2", TRAIN[0])
        a2.attempt(0, "FAIL", primitive_status="FAILURE")
        a2.attempt(1, "PASS")
        a2.close(True)
        # B: success, but the router's output had a fault injected; the verifier said PASS
        b = Episode(w, "B", TRAIN[1])
        b.call("planner", 0)
        b.call("router", 0, 0, extra={"injected_fault": "wrong_binding"})
        b.primitive(0, 0)
        b.verifier(0, "PASS")
        b.close(True)
        # D: failed episode; attempt 0 visibly failed, attempt 1 failed invisibly
        d = Episode(w, "D", TRAIN[2])
        d.attempt(0, "FAIL", primitive_status="FAILURE")
        d.attempt(1, "PASS")
        d.close(False)
    with TraceWriter(run_dir / "traces" / "shard-1.jsonl", fsync=False) as w:
        # E: a test-split task: never trained on
        e = Episode(w, "E", TEST[0])
        e.attempt(0, "PASS")
        e.close(True)
        # F: a dev task (validation), with an unparsed router output and two steps
        f = Episode(w, "F", DEV[0])
        f.call("planner", 0)
        f.call("router", 0, 0)
        f.call("router", 0, 1, parse_error="not JSON", raw="oops")
        f.primitive(0, 0)
        f.verifier(0, "PASS")
        f.close(True)
        # G: killed mid-episode: no record
        g = Episode(w, "G", TRAIN[3])
        g.call("planner", 0)
        g.call("router", 0, 0)
    with open(run_dir / "traces" / "shard-1.jsonl", "a") as fh:
        fh.write('{"kind": "event", "episode_id": "G", "ro')  # torn last line


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """One build of the hand-written run, shared by the tests that only read it."""
    root = tmp_path_factory.mktemp("built")
    write_run(root / "run")
    out = root / "run" / "datasets"
    report = build_role_datasets(root / "run", out,
                                 BuildOptions(verifier_balance=None, token_counter="whitespace"))
    return report, out


def load(out, role):
    from datasets import load_from_disk

    return load_from_disk(str(out / role))


def rows(out, role, split="train"):
    return [dict(r) for r in load(out, role)[split]]


def test_actor_roles_get_only_the_passing_attempt(built):
    report, out = built
    plans = rows(out, "planner")
    # A's re-plan (attempt 1, carrying the feedback) and B's plan; not A's attempt 0, not D
    assert sorted((r["episode_id"], r["attempt"]) for r in plans) == [("A", 1), ("B", 0)]
    replan = next(r for r in plans if r["episode_id"] == "A")
    assert "verifier feedback" in replan["messages"][1]["content"]
    assert [m["role"] for m in replan["messages"]] == ["system", "user", "assistant"]
    assert replan["teacher"] == "gold" and replan["verified"] is True and replan["step"] is None
    assert [(r["episode_id"], r["attempt"], r["step"]) for r in rows(out, "router")] == [("A", 1, 0)]
    primitives = rows(out, "primitive")
    assert sorted((r["episode_id"], r["attempt"]) for r in primitives) == [("A", 1), ("B", 0)]
    removed = report.roles["router"]["removed"]
    assert removed["injected_fault"] == 1  # B's router
    assert removed["episode_not_successful"] == 2  # D's two routers
    assert removed["attempt_not_verified"] == 2  # A's attempt 0 and A2's, before dedup
    assert removed["unparsed_output"] == 1  # F's step 1
    assert removed["no_episode_record"] == 1  # G
    assert removed["duplicate"] == 1  # A2's attempt 1
    assert report.roles["primitive"]["removed"]["attempt_not_verified"] == 2


def test_verifier_is_labelled_by_execution_and_checker(built):
    report, out = built
    verdicts = rows(out, "verifier")
    got = sorted((r["episode_id"], r["attempt"], r["verdict"]) for r in verdicts)
    # A: FAIL (primitive failed) and PASS; D: attempt 0 FAIL (visible); D attempt 1 unknown;
    # B: teacher said PASS on an attempt with an injected fault: the environment wins
    assert got == [("A", 0, "FAIL"), ("A", 1, "PASS"), ("D", 0, "FAIL")]
    for r in verdicts:
        assert json.loads(r["messages"][-1]["content"])["status"] == r["verdict"]
        assert r["fault_kind"] == ("none" if r["verdict"] == "PASS" else "unlabelled")
    removed = report.roles["verifier"]["removed"]
    assert removed["verdict_disagrees_with_env"] == 1
    assert removed["env_label_unknown"] == 1
    assert removed["duplicate"] == 2
    assert report.roles["verifier"]["verdicts"]["train"] == {"FAIL": 2, "PASS": 1}


def test_splits_are_task_disjoint_and_exclude_test_tasks(built):
    report, out = built
    assert report.validation_source == "dev_split"
    for role in ("planner", "router", "primitive", "verifier"):
        ds = load(out, role)
        train = {r["task_id"] for r in ds["train"]}
        validation = {r["task_id"] for r in ds["validation"]}
        assert not train & validation
        assert TEST[0] not in train | validation
        assert validation <= set(DEV) and train <= set(TRAIN)
        assert report.roles[role]["removed"]["test_split_task"] == 1
    assert [r["episode_id"] for r in rows(out, "planner", "validation")] == ["F"]
    assert report.episodes["without_record"] == 1
    assert report.read["torn_lines"] == 1


def test_card_report_and_histogram(built):
    report, out = built
    for role in ("planner", "router", "primitive", "verifier"):
        card = (out / role / "README.md").read_text()
        assert card.startswith("---\npretty_name: HEART")
        assert "| `duplicate` |" in card and "whitespace" in card
        assert (out / role / "token_lengths.png").read_bytes()[:4] == b"\x89PNG"
    card = (out / "verifier" / "README.md").read_text()
    assert "| `verdict_disagrees_with_env` | 1 |" in card and "environment won" in card
    saved = json.loads((out / "build_report.json").read_text())
    assert saved["roles"]["planner"]["splits"] == {"train": 2, "validation": 1}
    assert saved["roles"]["planner"]["tokens"]["train"]["n"] == 2
    assert saved["read"]["torn_lines"] == 1
    # the teacher's unparsed answers are counted before any filter, beside the episodes' outcomes
    router = (out / "router" / "README.md").read_text()
    episodes = saved["episodes"]
    assert f"Episodes recorded: {episodes['records']}, of which valid by the environment's checker: " \
           f"{episodes['successful']}" in router and episodes["records"] > episodes["successful"] > 0
    assert f"router answers read: {saved['roles']['router']['events_read']}; answers that did not parse: 1 " in router
    assert saved["roles"]["planner"]["unparsed"] == 0


def test_verifier_balance_downsamples_majority_deterministically(tmp_path):
    write_run(tmp_path / "run")
    options = BuildOptions(verifier_balance=1.0, token_counter="whitespace")
    report = build_role_datasets(tmp_path / "run", tmp_path / "o1", options)
    assert report.roles["verifier"]["verdicts"]["train"] == {"FAIL": 1, "PASS": 1}
    assert report.roles["verifier"]["removed"]["verifier_balance"] == 1
    build_role_datasets(tmp_path / "run", tmp_path / "o2", options)
    assert rows(tmp_path / "o1", "verifier") == rows(tmp_path / "o2", "verifier")


def test_balance_verdicts_ratio():
    examples = [{"messages": [{"role": "user", "content": str(i)}], "verdict": "PASS"}
                for i in range(10)]
    examples += [{"messages": [{"role": "user", "content": f"f{i}"}], "verdict": "FAIL"}
                 for i in range(3)]
    kept, removed, note = balance_verdicts(examples, 2.0, seed=0)
    assert (sum(e["verdict"] == "PASS" for e in kept), removed, note) == (6, 4, None)
    assert kept == [e for e in examples if e in kept]  # order preserved
    assert balance_verdicts(examples, 2.0, seed=1)[0] != kept  # the seed decides
    only_pass = examples[:10]
    assert balance_verdicts(only_pass, 1.0, 0)[1:] == (0, "not balanced: no FAIL examples")


def test_run_without_dev_tasks_holds_out_hashed_task_ids(tmp_path):
    with TraceWriter(tmp_path / "run" / "traces" / "s.jsonl", fsync=False) as w:
        for task in TRAIN:
            ep = Episode(w, f"ep-{task}", task)
            ep.attempt(0, "PASS")
            ep.close(True)
    report = build_role_datasets(tmp_path / "run", tmp_path / "out",
                                 BuildOptions(token_counter="whitespace"))
    assert report.validation_source == "hashed_task_fraction"
    ds = load(tmp_path / "out", "planner")
    train, validation = ({r["task_id"] for r in ds[s]} for s in ("train", "validation"))
    assert validation and train and not train & validation
    assert train | validation == set(TRAIN)
    tasks = {(ENV, t) for t in TRAIN}
    assert validation_tasks_by_fraction(tasks, 0.1) == validation_tasks_by_fraction(tasks, 0.1)


def test_cli_exit_codes(tmp_path, capsys):
    write_run(tmp_path / "run")
    assert main([str(tmp_path / "run"), "--tokenizer", "whitespace"]) == 0
    assert "verifier" in capsys.readouterr().out
    # existing output without --overwrite is refused
    assert main([str(tmp_path / "run"), "--tokenizer", "whitespace"]) == 2
    # all roles empty: only a killed episode
    with TraceWriter(tmp_path / "empty" / "traces" / "s.jsonl", fsync=False) as w:
        Episode(w, "K", TRAIN[0]).call("planner", 0)
    assert main([str(tmp_path / "empty"), "--tokenizer", "whitespace"]) == 1
    assert "every role is empty" in capsys.readouterr().err


def test_unknown_trace_version_stops_the_build(tmp_path, capsys):
    write_run(tmp_path / "run")
    path = tmp_path / "run" / "traces" / "shard-0.jsonl"
    lines = path.read_text().splitlines()
    lines[2] = json.dumps({**json.loads(lines[2]), "version": 7})
    path.write_text("\n".join(lines) + "\n")
    assert main([str(tmp_path / "run"), "--tokenizer", "whitespace"]) == 2
    assert "shard-0.jsonl:3: trace format version 7" in capsys.readouterr().err


def test_options_are_validated():
    with pytest.raises(ValueError, match="verifier_balance"):
        BuildOptions(verifier_balance=0.5)
    with pytest.raises(ValueError, match="validation_fraction"):
        BuildOptions(validation_fraction=1.0)
    with pytest.raises(ValueError, match="roles"):
        BuildOptions(roles=("planner", "critic"))
    assert asdict(BuildOptions())["verifier_balance"] == 1.0


@pytest.mark.slow
def test_default_token_counter_uses_the_smollm2_tokenizer():
    from heart.models import models_dir, read_manifest

    from heart_distill.data.card import load_token_counter

    if read_manifest(models_dir() / "smollm2-135m") is None:
        pytest.skip("SmolLM2 folder not prepared (python -m heart.models smollm2-135m)")
    counter = load_token_counter("default")
    assert counter.name.startswith("tokenizer:")
    messages = [{"role": "system", "content": "You are the planner."},
                {"role": "user", "content": "Book a flight."},
                {"role": "assistant", "content": '{"status": "SUFFICIENT", "plan": []}'}]
    (n,) = counter.count([messages])
    assert n > sum(len(m["content"].split()) for m in messages)  # template tokens included


def test_a_resumed_episode_uses_only_the_shard_that_closed_it(tmp_path):
    """A killed run leaves a partial episode in its shard; the resumed run re-runs it whole
    in a new shard. The partial events must not join the complete episode's examples."""
    run = tmp_path / "run"
    with TraceWriter(run / "traces" / "shard-0000.jsonl", fsync=False) as w:
        killed = Episode(w, "R", TRAIN[0])
        killed.call("planner", 0, user="plan R (the killed run)")
        killed.call("router", 0, 0, user="route R (the killed run)")
    with TraceWriter(run / "traces" / "shard-0001.jsonl", fsync=False) as w:
        again = Episode(w, "R", TRAIN[0])
        again.attempt(0, "PASS")
        again.close(True)
    report = build_role_datasets(run, tmp_path / "ds", BuildOptions(token_counter="whitespace"))
    from datasets import load_from_disk

    planner_ds = load_from_disk(str(tmp_path / "ds" / "planner"))
    users = [read_input(m[1]["content"])["user_query"] for split in planner_ds.values() for m in split["messages"]]
    assert users == [f"plan {TRAIN[0]}"]
    assert report.roles["planner"]["removed"]["no_episode_record"] == 1


def test_ungrounded_and_schema_invalid_answers_are_dropped_and_the_checks_printed(tmp_path, capsys):
    with TraceWriter(tmp_path / "run" / "traces" / "s.jsonl", fsync=False) as w:
        for i, task in enumerate(TRAIN[:4]):
            ep = Episode(w, f"ep{i}", task)
            ep.attempt(0, "PASS")
            ep.close(True)
        bad = Episode(w, "bad", TRAIN[4])
        _, plan = role_call("planner", "x", None)
        bad.call("planner", 0, output={**plan, "intent": {**plan["intent"], "task": "t" * 500}})
        _, route = role_call("router", "x", None)
        route["dispatch"][0]["resolved_bindings"] = {"path": "/secret/invented"}  # not in the input
        bad.call("router", 0, output=route)
        good_route = json.loads(json.dumps(route))
        good_route["dispatch"][0]["resolved_bindings"] = {"path": "attempt"}  # in its input
        bad.call("router", 0, 1, output=good_route)
        bad.primitive(0, 0)
        bad.verifier(0, "PASS")
        bad.close(True)
    assert main([str(tmp_path / "run"), "--tokenizer", "whitespace"]) == 0
    out = capsys.readouterr().out
    assert "checks:" in out
    assert "router literal values found in the router's input: 100.0%" in out
    assert "targets valid against their serving schema: planner 100.0%" in out
    report = json.loads((tmp_path / "run" / "datasets" / "build_report.json").read_text())
    assert report["roles"]["planner"]["removed"]["not_schema_valid"] == 1
    assert report["roles"]["router"]["removed"]["router_ungrounded"] == 1
    assert report["roles"]["router"]["quality"]["literal_values"] == 1
    assert report["roles"]["planner"]["quality"]["only_shown_tools_rate"] == 1.0
    assert set(report["roles"]["planner"]["prompt_tokens"]) == {
        "full system prompt, compact input", "short system prompt, compact input",
        "full system prompt, indented input (before)"}
    card = (tmp_path / "run" / "datasets" / "router" / "README.md").read_text()
    assert "grounded rate" in card and "| `router_ungrounded` | 1 |" in card


def test_the_same_episodes_in_another_order_give_the_same_datasets(tmp_path):
    """Concurrent episodes append to a trace in whatever order they finish; the datasets, and
    so every seeded sample drawn from them, must not depend on it."""
    write_run(tmp_path / "written")
    lines = (tmp_path / "written" / "traces" / "shard-0.jsonl").read_text().splitlines(keepends=True)
    by_episode: dict[str, list[str]] = {}
    for line in lines:
        by_episode.setdefault(json.loads(line)["episode_id"], []).append(line)
    assert len(by_episode) >= 4
    orders = {"in_order": list(by_episode), "reversed": list(reversed(by_episode))}
    built = {}
    for name, order in orders.items():
        (tmp_path / name / "traces").mkdir(parents=True)
        (tmp_path / name / "traces" / "shard-0.jsonl").write_text("".join(line for e in order for line in by_episode[e]))
        build_role_datasets(tmp_path / name, tmp_path / name / "datasets", BuildOptions(token_counter="whitespace"))
        datasets = {role: load(tmp_path / name / "datasets", role) for role in ("planner", "router", "primitive", "verifier")}
        built[name] = {role: {split: rows.to_list() for split, rows in splits.items()} for role, splits in datasets.items()}
    assert built["in_order"] == built["reversed"]
    assert any(rows for splits in built["in_order"].values() for rows in splits.values())


def test_tasks_without_expected_calls_train_only_where_the_teachers_verifier_passed_every_turn(tmp_path):
    """A tasks file's task without expected calls is not scored (``details.scored: false``):
    its episode trains the actor roles only when the teacher's own Verifier passed every turn,
    marked ``verified_by: teacher`` and counted apart in the card; its Verifier calls get no
    PASS label (the teacher would label itself)."""
    unscored = {"scored": False, "error_type": "custom:unscored"}
    with TraceWriter(tmp_path / "run" / "traces" / "shard-0.jsonl", fsync=False) as w:
        checked = Episode(w, "checked", TRAIN[0], teacher="openai")
        checked.attempt(0, "PASS")
        checked.close(True)
        passed = Episode(w, "passed", TRAIN[1], teacher="openai")
        passed.attempt(0, "PASS")
        passed.close(False, ["PASS"], unscored)
        failed = Episode(w, "failed", TRAIN[2], teacher="openai")
        failed.attempt(0, "FAIL")
        failed.close(False, ["FAIL"], unscored)
        wrong = Episode(w, "wrong", TRAIN[3], teacher="openai")  # scored, rejected: never the teacher's word
        wrong.attempt(0, "PASS")
        wrong.close(False, ["PASS"], {"scored": True, "error_type": "custom:calls"})
    out = tmp_path / "datasets"
    report = build_role_datasets(tmp_path / "run", out, BuildOptions(verifier_balance=None, token_counter="whitespace"))
    def every_row(role):
        return [dict(row) for split in load(out, role).values() for row in split]

    planner_rows = every_row("planner")
    assert sorted((r["episode_id"], r["verified_by"]) for r in planner_rows) == [("checked", "checker"),
                                                                                 ("passed", "teacher")]
    assert report.episodes["teacher_verified"] == 1
    assert {r["episode_id"] for r in every_row("verifier")} <= {"checked"}
    card = (out / "planner" / "README.md").read_text()
    assert "Rows verified by the environment's checker: 1; by the teacher's own Verifier" in card
    assert "1 such episodes): 1." in card


def test_the_planner_card_counts_first_plans_by_the_tools_offered():
    """A length the offer alone predicts (one tool offered, always several calls) shows in the
    card: the cue a Planner adapter learns instead of counting the request."""
    from heart.roles import planner
    from heart.roles.common import render_input
    from heart_distill.data.card import quality_stats, render_quality

    def row(tools, steps, attempt=0):
        payload = planner.build_payload("q", [{"name": t, "category": "", "description": t} for t in tools])
        plan = [{"step": i, "tool_category": "", "tool_hint": tools[0], "objective": "o", "dependencies": []}
                for i in range(1, steps + 1)]
        answer = {"status": "SUFFICIENT", "intent": {"task": "t", "objective": "o", "tool_categories": [""],
                                                     "constraints": []}, "plan": plan, "replanned": False}
        return {"messages": [{"role": "user", "content": render_input(planner.INSTRUCTION, payload)},
                             {"role": "assistant", "content": json.dumps(answer)}], "attempt": attempt}

    examples = [row(["area"], 2), row(["area"], 3), row(["area", "volume"], 1), row(["area"], 1, attempt=1)]
    quality = quality_stats("planner", examples)
    by_offer = quality["first_plan_lengths_by_offer"]
    assert by_offer["one tool"]["2 steps"] == 1 and by_offer["one tool"]["3+ steps"] == 1
    assert by_offer["one tool"]["1 step"] == 0  # the re-plan is not a first plan
    assert by_offer["several tools"]["1 step"] == 1
    assert "| one tool | 0 | 0 | 1 | 1 | 0 |" in "\n".join(render_quality("planner", quality, {}))
