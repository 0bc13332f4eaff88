"""The named filters that decide which role calls become training examples.

Every rule is named here, in the order the build applies it, with the sentence the dataset
card prints beside the count of examples it removed. Two kinds of rule:

- event filters (:data:`EVENT_FILTERS`) judge one trace event with the facts of its
  episode (:class:`EpisodeFacts`): what the environment's checker said, which attempt of
  each turn the Verifier passed, and where execution visibly failed;
- dataset rules (:func:`dedupe`, the split rules, :func:`balance_verdicts`) act on the
  examples that survive, per role.

The principle: Planner, Router and Primitive learn only from verified material (a
successful episode, the attempt the Verifier passed) that a student could produce from its
own input (a Router value not in the Router's input is not learnable; an answer outside the
role's serving schema is not producible); the Verifier learns PASS and FAIL per step,
labelled by what execution, injected faults and the checker showed, never by the teacher's
own verdict.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Callable

import jsonschema

from heart import ROLES
from heart.grounding import ungrounded_literals

ACTOR_ROLES = ("planner", "router", "primitive")
"""The roles that act; they learn only from attempts the Verifier passed in episodes the
environment scored as a success."""

Event = dict[str, Any]
Example = dict[str, Any]


@dataclass
class AttemptFacts:
    """What one (turn, attempt) of an episode showed."""

    verdict: str | None = None
    """The parsed verdict of the attempt's (last) Verifier call, if any."""
    visible_failure: bool = False
    """A Primitive returned FAILURE, or a fault was injected into a non-Verifier output."""
    faulted_steps: set = field(default_factory=set)
    """Plan steps into which a teacher injected a fault (Router or Primitive)."""
    executed_tools: set = field(default_factory=set)
    """Tools whose Primitive call returned SUCCESS in this attempt."""
    last_verified_step: int | None = None
    """The step of the attempt's last Verifier call (the one that ended it)."""


@dataclass
class EpisodeFacts:
    """An episode's record plus the per-attempt facts the filters need."""

    record: dict[str, Any]
    attempts: dict[tuple[int, int], AttemptFacts] = field(default_factory=dict)
    last_attempt: dict[int, int] = field(default_factory=dict)
    """Turn → its last attempt (the one the turn ended on)."""

    @classmethod
    def from_events(cls, record: dict[str, Any], events: list[Event]) -> "EpisodeFacts":
        facts = cls(record=record)
        for event in events:
            turn, attempt = event["turn"], event["attempt"]
            facts.last_attempt[turn] = max(attempt, facts.last_attempt.get(turn, attempt))
            found = facts.attempts.setdefault((turn, attempt), AttemptFacts())
            role = event["role"]
            if role == "verifier":
                if event["step"] is not None:
                    found.last_verified_step = max(event["step"], found.last_verified_step or event["step"])
                # A fault injected into the Verifier's own output says nothing about whether
                # execution went wrong; that Verifier example is dropped by its own filter.
                if event["parse_error"] is None and isinstance(event["parsed"], dict):
                    found.verdict = event["parsed"].get("status")
                continue
            if injected_fault(event):
                found.visible_failure = True
                step = (event.get("extra") or {}).get("fault_step", event["step"])
                if step is not None:
                    found.faulted_steps.add(step)
            if role == "primitive" and envelope_status(event) == "FAILURE":
                found.visible_failure = True
            if role == "primitive" and envelope_status(event) == "SUCCESS":
                found.executed_tools.add(((event.get("extra") or {}).get("envelope") or {}).get("tool"))
        return facts

    def turn_tools(self, turn: int) -> set:
        """Tools whose Primitive call returned SUCCESS in any attempt of ``turn``."""
        return set().union(*(f.executed_tools for (t, _), f in self.attempts.items() if t == turn))

    @property
    def verified_by(self) -> str | None:
        """Who verified the episode: ``checker`` (the environment's checker accepted it),
        ``teacher`` (a task the checker does not score — a tasks file's task without expected
        calls, ``details.scored: false`` — whose every turn the teacher's own Verifier passed),
        or None."""
        if self.record.get("success"):
            return "checker"
        verdicts = self.record.get("verdicts") or []
        if (self.record.get("checker") or {}).get("scored") is False and verdicts and set(verdicts) == {"PASS"}:
            return "teacher"
        return None

    @property
    def success(self) -> bool:
        """The episode is verified (:attr:`verified_by`): its calls may train the actor roles."""
        return self.verified_by is not None

    def passed_attempt(self, turn: int) -> int | None:
        """The attempt the Verifier passed in ``turn``: its last attempt, if that one PASSed."""
        last = self.last_attempt.get(turn)
        if last is None or self.attempts[(turn, last)].verdict != "PASS":
            return None
        return last

    def env_verdict(self, event: Event) -> str | None:
        """The label execution, faults and the checker give a Verifier call: PASS, FAIL or
        None (unknown), read from the steps in the Verifier's own input.

        FAIL when a judged step did not return SUCCESS or had a fault injected (a semantic
        fault executes cleanly yet deviates from the gold call); PASS when no judged step
        shows either and the checker accepted the episode (for a whole-attempt verdict: on
        the turn's last attempt); otherwise the evidence is silent and the label unknown.
        """
        turn, attempt = event["turn"], event["attempt"]
        facts = self.attempts.get((turn, attempt), AttemptFacts())
        steps = judged_steps(event)
        if steps is None:
            return None
        if any(s["envelope"]["status"] != "SUCCESS" or s["step"] in facts.faulted_steps for s in steps):
            return "FAIL"
        if self.verified_by != "checker":  # (a teacher-verified episode would label its own Verifier)
            return None
        if self.left_incomplete(event):
            return "FAIL"
        if event["step"] is None and attempt != self.last_attempt.get(turn):
            return None
        return "PASS"


    def left_incomplete(self, event: Event) -> bool:
        """The Verifier call that ended a clean attempt which did not finish the turn: every
        call of the attempt ran as asked (no failure, no fault), yet in a successful episode a
        later attempt of the same turn had to run a tool this attempt never ran. Its FAIL on
        task_completion ("still to do: ...") is what the environment shows, and is taught."""
        turn, attempt = event["turn"], event["attempt"]
        facts = self.attempts.get((turn, attempt), AttemptFacts())
        if facts.visible_failure or facts.faulted_steps or attempt == self.last_attempt.get(turn):
            return False
        if event["step"] is None or event["step"] != facts.last_verified_step:
            return False
        later = set().union(*(f.executed_tools for (t, a), f in self.attempts.items() if t == turn and a > attempt))
        return bool(later - facts.executed_tools)


def is_relevance(event: Event) -> bool:
    """A Primitive call in relevance mode (:mod:`heart.roles.relevance`): "does my tool apply?"."""
    return (event.get("extra") or {}).get("mode") == "relevance"


def relevance_label(event: Event, facts: "EpisodeFacts") -> bool | None:
    """Whether the judged tool applied, as the episode shows it: it applies when the turn ran
    it successfully (a turn's gold tools, in a gold teacher's verified episode); a retrieved
    candidate the turn did not use does not. None when the input names no tool."""
    payload = event_input(event)
    tool = ((payload or {}).get("tool") or {}).get("name")
    if tool is None:
        return None
    return tool in facts.turn_tools(event["turn"])


def injected_fault(event: Event) -> str | None:
    return (event.get("extra") or {}).get("injected_fault")


def envelope_status(event: Event) -> str | None:
    envelope = (event.get("extra") or {}).get("envelope") or {}
    return envelope.get("status")


def teacher_verdict(event: Event) -> str | None:
    parsed = event["parsed"]
    return parsed.get("status") if isinstance(parsed, dict) else None


def event_input(event: Event) -> dict[str, Any] | None:
    """The JSON payload of the role call, or None when its user message has none."""
    from heart.roles.common import role_input

    try:
        return role_input(event["messages"])
    except (ValueError, StopIteration, KeyError):
        return None


def judged_steps(event: Event) -> list[dict[str, Any]] | None:
    """The steps a Verifier call judged (from its input)."""
    payload = event_input(event)
    steps = payload.get("steps") if isinstance(payload, dict) else None
    return steps if isinstance(steps, list) else None


def schema_valid(event: Event) -> bool:
    """The answer validates against the schema its role is served with for this input."""
    from heart.roles import ROLE_MODULES, relevance

    payload = event_input(event)
    if payload is None:
        return False
    try:
        answer = json.loads(event["raw_output"])
        # the validator class directly: jsonschema.validate re-checks the schema every call
        module = relevance if is_relevance(event) else ROLE_MODULES[event["role"]]
        return jsonschema.Draft202012Validator(module.schema_for_input(payload)).is_valid(answer)
    except (ValueError, KeyError, TypeError, AttributeError):
        return False


def router_ungrounded(event: Event) -> list[tuple[str, Any]]:
    """Literal binding values of a Router answer that do not occur in the Router's input."""
    user = next(m["content"] for m in reversed(event["messages"]) if m["role"] == "user")
    return [pair for d in (event["parsed"] or {}).get("dispatch", [])
            for pair in ungrounded_literals(d.get("resolved_bindings", {}), user)]


NATURAL_LANGUAGE_FIELDS: dict[str, tuple[str, ...]] = {
    "planner": ("intent.task", "intent.objective", "intent.constraints.*", "subgoals.*", "plan.*.objective",
                "clarification"),
    "router": ("dispatch.*.invocation_request",),
    "primitive": ("reason", "how", "messages.*.note"),
    "verifier": ("feedback",),
}
"""The fields of each role's answer that a teacher writes in words (dotted paths, ``*`` for
every item of a list): the ones that must hold whole sentences."""


def clipped_fields(role: str, answer: Any) -> list[str]:
    """The natural-language fields of ``answer`` (:data:`NATURAL_LANGUAGE_FIELDS`) that hold
    a clause cut off with an ellipsis: ``["plan.2.objective", …]``."""
    from heart.roles.common import is_clipped

    found: list[str] = []

    def walk(value: Any, keys: list[str], path: list[str]) -> None:
        if not keys:
            if is_clipped(value):
                found.append(".".join(path))
            return
        key, rest = keys[0], keys[1:]
        if key == "*":
            for index, item in enumerate(value if isinstance(value, list) else []):
                walk(item, rest, [*path, str(index)])
        elif isinstance(value, dict) and key in value:
            walk(value[key], rest, [*path, key])

    for spec in NATURAL_LANGUAGE_FIELDS.get(role, ()):
        walk(answer, spec.split("."), [])
    return found


@dataclass(frozen=True)
class EventFilter:
    """A rule that keeps or drops one event of one of ``roles``."""

    name: str
    description: str
    """What the rule removes and why: printed on the dataset card."""
    roles: tuple[str, ...]
    keep: Callable[[Event, EpisodeFacts], bool]


EVENT_FILTERS: tuple[EventFilter, ...] = (
    EventFilter(
        "episode_not_successful",
        "calls from episodes the environment's checker did not accept",
        ACTOR_ROLES,
        lambda e, facts: facts.success,
    ),
    EventFilter(
        "attempt_not_verified",
        "calls from attempts other than the one the Verifier passed in their turn (failed "
        "attempts before a re-plan, and turns whose last attempt did not PASS)",
        ACTOR_ROLES,
        # (relevance calls are asked once per turn, before its first plan: their label is
        # what the turn used, see relevance_disagrees_with_use)
        lambda e, facts: is_relevance(e) or e["attempt"] == facts.passed_attempt(e["turn"]),
    ),
    EventFilter(
        "unparsed_output",
        "outputs the role's parser rejected (for the Verifier: no PASS/FAIL verdict)",
        ROLES,
        lambda e, facts: e["parse_error"] is None
        and isinstance(e["parsed"], dict)
        and (e["role"] != "verifier" or teacher_verdict(e) in ("PASS", "FAIL")),
    ),
    EventFilter(
        "not_schema_valid",
        "answers that do not validate against the JSON schema the role is served with for "
        "that input (`schema_for_input`): a student decoding under that schema could not "
        "produce them",
        ROLES,
        lambda e, facts: schema_valid(e),
    ),
    EventFilter(
        "injected_fault",
        "outputs into which a teacher deliberately injected a fault",
        ROLES,
        lambda e, facts: not injected_fault(e),
    ),
    EventFilter(
        "primitive_failure",
        "Primitive calls whose execution envelope is not SUCCESS",
        ("primitive",),
        lambda e, facts: is_relevance(e) or envelope_status(e) == "SUCCESS",
    ),
    EventFilter(
        "relevance_disagrees_with_use",
        "relevance answers (the Primitive's relevance mode) that disagree with what the "
        "verified turn used: a tool the turn ran applies, a retrieved candidate it did not "
        "run does not; the episode wins over the teacher",
        ("primitive",),
        lambda e, facts: not is_relevance(e) or (e["parsed"] or {}).get("applies") == relevance_label(e, facts),
    ),
    EventFilter(
        "router_ungrounded",
        "Router answers binding a literal value that does not occur in the Router's input "
        "(query, clarifications, conversation, earlier results, plan): not learnable from it",
        ("router",),
        lambda e, facts: not router_ungrounded(e),
    ),
    EventFilter(
        "env_label_unknown",
        "Verifier calls where neither execution, injected faults nor the checker show the "
        "answer (no failure or fault in the judged steps, yet the episode failed)",
        ("verifier",),
        lambda e, facts: facts.env_verdict(e) is not None,
    ),
    EventFilter(
        "verdict_disagrees_with_env",
        "Verifier calls whose verdict contradicts the environment's label: the "
        "environment wins, and the teacher's mistaken verdict is not taught",
        ("verifier",),
        lambda e, facts: teacher_verdict(e) == facts.env_verdict(e),
    ),
)

RULES: dict[str, str] = {
    "no_episode_record": "calls of episodes that never wrote an episode record (killed mid-"
    "episode): without the checker's word nothing in them is verified",
    "errored_episode": "calls of episodes that ended errored (a backend exception, a checker "
    "crash, a tool call abandoned on timeout): infrastructure failed, nothing is verified",
    "event_after_episode_record": "calls written after their episode's record (not produced "
    "by a normal run; kept out so an episode is judged once)",
    "unknown_role": "events of a role this build does not know",
    **{f.name: f.description for f in EVENT_FILTERS},
    "duplicate": "exact duplicates (same messages, assistant answer included); the first is kept",
    "test_split_task": "examples of tasks in the toolkit's test split: never trained on",
    "relevance_balance": "relevance rows of the majority label (usually \"does not apply\") dropped "
    "(seeded, deterministic) so that majority/minority <= the configured ratio, in each split",
    "verifier_balance": "majority-verdict Verifier examples dropped (seeded, deterministic) so "
    "that majority/minority <= the configured ratio, in each split",
}
"""Every rule, in the order the build applies it, with its card description."""


def first_failing_filter(event: Event, facts: EpisodeFacts) -> str | None:
    """The name of the first event filter that drops ``event``, or None to keep it."""
    role = event["role"]
    for rule in EVENT_FILTERS:
        if role in rule.roles and not rule.keep(event, facts):
            return rule.name
    return None


def example_key(messages: list[dict[str, str]]) -> bytes:
    """Identity of an example for exact-duplicate removal (a digest of roles and contents)."""
    digest = hashlib.blake2b(digest_size=16)
    for message in messages:
        # Length prefixes make the encoding unambiguous whatever the contents hold.
        for part in (message["role"].encode(), message["content"].encode()):
            digest.update(len(part).to_bytes(8, "little"))
            digest.update(part)
    return digest.digest()


def dedupe(examples: list[Example]) -> tuple[list[Example], int]:
    """Drop exact duplicates of ``messages``; return (kept, removed) in a canonical order.

    Concurrent episodes append to their traces in whatever order they finish, so two
    collections of the same episodes list them differently. Ordering by provenance (episode,
    turn, attempt, step), then by content, and keeping the first of each duplicate makes the
    dataset, and every seeded sample drawn from it (a recipe's ``max_train_examples``, the
    evaluations' ``--limit``), the same for the same episodes: measured before this, two
    pipeline runs trained their Verifiers on different 32-row samples of the same 352 rows.
    """
    keyed = sorted((_provenance(e), example_key(e["messages"]), i) for i, e in enumerate(examples))
    seen: set[bytes] = set()
    kept = []
    for _, key, index in keyed:
        example = examples[index]
        if key not in seen:
            seen.add(key)
            kept.append(example)
    return kept, len(examples) - len(kept)


def _provenance(example: Example) -> tuple:
    """Where an example comes from, as a sortable key (a missing step sorts first)."""
    return tuple((value is not None, value) for value in
                 (example.get(k) for k in ("env", "task_id", "episode_id", "turn", "attempt", "step")))


def balance_verdicts(
    examples: list[Example], max_ratio: float, seed: int,
    label: Callable[[Example], str] = lambda e: e["verdict"], labels: tuple[str, str] = ("PASS", "FAIL"),
) -> tuple[list[Example], int, str | None]:
    """Downsample the majority verdict so that majority / minority <= ``max_ratio``.

    Which majority examples stay is decided by a seeded hash of their content, so the same
    inputs and seed give the same dataset, and the survivors keep their original order.
    Returns (kept, removed, note); with no minority example at all nothing is removed and
    the note says so (balancing would empty the split). ``label`` and ``labels`` name the
    two classes (the Verifier's verdicts by default; relevance rows: applies or not).
    """
    by_verdict: dict[str, list[int]] = {name: [] for name in labels}
    for index, example in enumerate(examples):
        by_verdict[label(example)].append(index)
    majority, minority = sorted(by_verdict, key=lambda v: (-len(by_verdict[v]), v))
    n_major, n_minor = len(by_verdict[majority]), len(by_verdict[minority])
    if n_major == 0:
        return examples, 0, None
    if n_minor == 0:
        return examples, 0, f"not balanced: no {minority} examples"
    limit = max(n_minor, int(max_ratio * n_minor))
    if n_major <= limit:
        return examples, 0, None

    def rank(index: int) -> bytes:
        key = example_key(examples[index]["messages"])
        return hashlib.blake2b(seed.to_bytes(8, "little", signed=True) + key, digest_size=16).digest()

    dropped = set(sorted(by_verdict[majority], key=rank)[limit:])
    kept = [example for index, example in enumerate(examples) if index not in dropped]
    return kept, len(dropped), None
