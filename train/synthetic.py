"""Small synthetic role datasets in the data side's exact format, for tests and benchmarks.

Each row is one role call (system = the role's full prompt from ``heart.roles.<role>``, user =
an instruction plus a JSON input block, assistant = the role's JSON output) with provenance
columns; splits are disjoint by task id. Real datasets from collection replace these
unchanged.

    python -m heart_distill.train.synthetic runs/smollm2-demo/datasets --train 64 --validation 8
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from heart import ROLES
from heart.roles import get_role

TOOLS = [
    ("get_weather", "Current weather for a city.", {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}),
    ("send_email", "Send an email to one recipient.", {"to": {"type": "string"}, "subject": {"type": "string"}, "body": {"type": "string"}}),
    ("search_flights", "Find flights between two airports on a date.", {"origin": {"type": "string"}, "destination": {"type": "string"}, "date": {"type": "string"}}),
    ("create_event", "Add an event to the calendar.", {"title": {"type": "string"}, "date": {"type": "string"}, "duration_min": {"type": "integer"}}),
    ("get_balance", "Balance of a bank account.", {"account_id": {"type": "string"}}),
    ("list_files", "List the files in a folder.", {"path": {"type": "string"}}),
]
CITIES = ["Paris", "Lagos", "Osaka", "Lima", "Oslo", "Austin", "Pune", "Cairo"]
PEOPLE = ["ana@example.com", "li@example.com", "sam@example.com", "kofi@example.com"]


def _role_prompt(role: str, short: bool = False) -> str:
    return get_role(role).system_prompt(short=short)


def _user(instruction: str, payload: dict[str, Any]) -> str:
    block = json.dumps(payload, ensure_ascii=False, indent=1)
    return f"{instruction}\n\nINPUT:\n```json\n{block}\n```"


def _task(rng: random.Random) -> dict[str, Any]:
    city, other, person = rng.choice(CITIES), rng.choice(CITIES), rng.choice(PEOPLE)
    date = f"2025-0{rng.randint(1, 9)}-{rng.randint(10, 28)}"
    kind = rng.randrange(3)
    if kind == 0:
        return {"query": f"What's the weather in {city}? Email it to {person}.",
                "steps": [("get_weather", f"Get the current weather in {city}", {"city": city, "unit": "celsius"}),
                          ("send_email", f"Email the weather in {city} to {person}",
                           {"to": person, "subject": f"Weather in {city}", "body": "$step_1.summary"})]}
    if kind == 1:
        return {"query": f"Find a flight from {city} to {other} on {date} and put it in my calendar.",
                "steps": [("search_flights", f"Find flights from {city} to {other} on {date}",
                           {"origin": city, "destination": other, "date": date}),
                          ("create_event", f"Add the flight to {other} on {date} to the calendar",
                           {"title": f"Flight to {other}", "date": date, "duration_min": rng.choice([90, 120, 180])})]}
    return {"query": f"How much is in account {rng.randint(1000, 9999)}?",
            "steps": [("get_balance", "Look up the account balance", {"account_id": str(rng.randint(1000, 9999))})]}


def _example(role: str, task: dict[str, Any], rng: random.Random, compact: bool) -> tuple[str, str]:
    """(user message, assistant output) for one role call of a task."""
    steps = task["steps"]
    used = {tool for tool, _, _ in steps}
    tools = [{"name": n, "description": d} for n, d, _ in TOOLS if not compact or n in used]
    plan = [{"step": i, "tool": tool, "objective": objective, "depends_on": [i - 1] if i > 1 else []}
            for i, (tool, objective, _) in enumerate(steps, start=1)]
    if role == "planner":
        out = {"status": "SUFFICIENT", "intent": task["query"].split("?")[0].split(" and ")[0], "plan": plan}
        return _user("Plan the next actions for this query.", {"user_query": task["query"], "available_tools": tools}), json.dumps(out)
    if role == "router":
        dispatch = [{"step": p["step"], "target_tool": p["tool"], "invocation_request": p["objective"],
                     "resolved_bindings": {k: v for k, v in args.items() if str(v).startswith("$step_")},
                     "h_params": {"retry": 1, "priority": 0, "timeout_s": 10.0}}
                    for p, (_, _, args) in zip(plan, steps)]
        return (_user("Write the dispatch for every step of this plan.", {"user_query": task["query"], "plan": plan}),
                json.dumps({"status": "READY", "dispatch": dispatch}))
    if role == "primitive":
        tool, objective, args = rng.choice(steps)
        name, description, params = next(t for t in TOOLS if t[0] == tool)
        card = {"name": name, "description": description,
                "parameters": {"type": "object", "properties": params, "required": list(params)}}
        return (_user("Resolve this request into arguments for your tool.",
                      {"invocation_request": objective, "resolved_bindings": {}, "tool": card}),
                json.dumps({"tool": tool, "arguments": args, "status": "RESOLVED", "reason": ""}))
    passed = rng.random() < 0.7
    executed = [{"step": i, "tool": t, "status": "SUCCESS", "arguments": a} for i, (t, _, a) in enumerate(steps, 1)]
    criteria = {"task_completion": passed, "argument_consistency": True, "execution_validity": True,
                "constraint_satisfaction": True}
    out = {"verdict": "PASS" if passed else "FAIL", "criteria": criteria,
           "feedback": "" if passed else f"Step {len(steps)} did not complete the request: redo it.",
           "response": "Done." if passed else ""}
    return (_user("Verify this attempt.", {"user_query": task["query"], "plan": plan, "executed": executed}),
            json.dumps(out))


def synthetic_rows(role: str, n: int, seed: int, task_offset: int, compact: bool = False) -> list[dict[str, Any]]:
    """``compact`` rows (short system prompt, only the tools used) are ~4x shorter: for CPU tests."""
    rng = random.Random(f"{role}-{seed}-{task_offset}")
    system = _role_prompt(role, short=compact)
    rows = []
    for i in range(n):
        task = _task(rng)
        user, assistant = _example(role, task, rng, compact)
        rows.append({
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": user},
                         {"role": "assistant", "content": assistant}],
            "episode_id": f"synthetic-{role}-{task_offset + i}", "task_id": f"task-{task_offset + i}",
            "env": "synthetic", "teacher": "scripted", "verified": True,
        })
    return rows


def write_synthetic_role_dataset(out_dir: str | Path, role: str, n_train: int = 32, n_validation: int = 8,
                                 seed: int = 0, compact: bool = False) -> Path:
    """Save a DatasetDict for ``role`` at ``<out_dir>/<role>`` and return that folder."""
    from datasets import Dataset, DatasetDict

    folder = Path(out_dir) / role
    DatasetDict({
        "train": Dataset.from_list(synthetic_rows(role, n_train, seed, 0, compact)),
        "validation": Dataset.from_list(synthetic_rows(role, n_validation, seed, 100_000, compact)),
    }).save_to_disk(str(folder))
    return folder


if __name__ == "__main__":
    import argparse

    from heart.argtypes import nonnegative_int, positive_int

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir")
    parser.add_argument("--roles", default=",".join(ROLES))
    parser.add_argument("--train", type=positive_int, default=64)
    parser.add_argument("--validation", type=nonnegative_int, default=8)
    parser.add_argument("--compact", action="store_true", help="short system prompt, only the tools used")
    args = parser.parse_args()
    for role in args.roles.split(","):
        print(write_synthetic_role_dataset(args.out_dir, role, args.train, args.validation, compact=args.compact))
