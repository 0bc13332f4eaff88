"""Relevance before selection (HEELO): the candidates judge themselves, the Planner sees those that apply.

ToolFace ranks the request's candidates (its fused score, top ``candidates``, default 20:
every gold tool is among them far more often than among the 10 a Planner can be shown);
each candidate's Primitive, in its relevance mode (:mod:`heart.roles.relevance`), answers
``{"applies": ..., "how": ...}`` for the request, all candidates in one batch
(:meth:`heart.calls.RoleClient.call_batch`, one trace event each, ``extra["mode"] =
"relevance"``); the Planner is shown the candidates that apply, at most ``shown`` (10).

Two policies decide what the Planner is shown:

- **gate** (:func:`select`, no thresholds): the candidates that answer ``applies: true``,
  best ToolFace rank first, at most ``shown``. A weak judge loses gold tools: the 1:1
  relevance adapter showed every gold tool for 0.433 of AgentDojo's held-out turns against
  0.967 for ToolFace's default list (``bench/results/toolface_relevance.json``).
- **prune** (:func:`prune`, with :class:`Thresholds`): ToolFace's default list is the floor.
  Each candidate's answer is scored — ``P(applies)`` from the verdict token's
  log-probabilities (:data:`heart.roles.relevance.SCORE_PREFIX`,
  ``SamplingConfig.first_token_logprobs``: no second pass) — and a default tool is removed
  only when its score is below ``prune_below``, a candidate outside the list added only when
  it is at least ``add_above``. :func:`calibrate` chooses both on held-out (dev) turns:
  ``prune_below`` the highest that keeps ≥ 99% of the gold tools the list holds,
  ``add_above`` the lowest whose additions are gold at least half the time (none when no
  threshold is). The shown tools carry their ``how`` for the Planner.

An answer that does not parse counts as "does not apply" under gate, and is recorded as
unparsed (:attr:`Judgement.error`, and the trace event's ``parse_error``); under prune its
score still decides, and an answer with neither a parse nor a score leaves the list as it is.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from heart.calls import RoleClient
from heart.roles import relevance
from heart.toolface import ToolFace

CANDIDATES = 20
"""Candidates ToolFace ranks for the relevance step (its hybrid top 20)."""
SHOWN = 10
"""Most tools the Planner is shown after the relevance step."""


@dataclass(frozen=True)
class Judgement:
    """One candidate's relevance answer."""

    name: str
    rank: int
    """Its position in ToolFace's ranking (0: best)."""
    applies: bool
    how: str = ""
    error: str | None = None
    """Why the answer did not parse (then ``applies`` is False)."""
    p: float | None = None
    """P(applies): from the verdict token's log-probabilities when the answer was scored; a
    backend that reports none gives its parsed answer's certainty (1.0 or 0.0); None when
    the answer neither parsed nor was scored."""


@dataclass(frozen=True)
class Thresholds:
    """The prune policy's two thresholds on P(applies) (:func:`calibrate` chooses them)."""

    prune_below: float
    """A default-list tool scored below this is removed (0: none is)."""
    add_above: float | None
    """A candidate outside the default list scored at least this is added (None: none is)."""
    calibration: dict | None = None
    """How they were chosen: the dev turns, gold tools, recall kept, additions' precision."""

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(asdict(self), indent=1) + "\n")
        return path

    @classmethod
    def load(cls, path: str | Path) -> "Thresholds":
        """Thresholds from a file :meth:`save` wrote; a file without them is refused by name."""
        try:
            data = json.loads(Path(path).read_text())
            return cls(float(data["prune_below"]),
                       None if data.get("add_above") is None else float(data["add_above"]),
                       data.get("calibration"))
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise ValueError(f"relevance thresholds {path}: not a thresholds file ({type(err).__name__}: {err})") \
                from err


def candidate_cards(toolface: ToolFace, names: list[str]) -> list[dict[str, Any]]:
    """The relevance cards of ToolFace's candidates ``names``."""
    cards = []
    for name in names:
        spec = toolface.get(name).spec
        cards.append(relevance.relevance_card(name, spec.own_description(), spec.parameters))
    return cards


def judge(roles: RoleClient, request: str, cards: list[dict[str, Any]], attempt: int = 0,
          system_prompt: str = relevance.SYSTEM_PROMPT, prefill: bool = False,
          constrained: bool = False, scored: bool = False,
          max_new_tokens: int = relevance.MAX_NEW_TOKENS) -> list[Judgement]:
    """Ask every card's Primitive, in one batch, whether it applies to ``request``.

    ``scored``: each answer starts from :data:`~heart.roles.relevance.SCORE_PREFIX` and its
    verdict token's log-probabilities give :attr:`Judgement.p` (the prune policy's score;
    decoded without a grammar, whose forced tokens would come before the verdict).
    ``max_new_tokens`` below the mode's budget cuts the answers (1: the verdict alone, whose
    probability is all a measurement of the prune policy reads; the answers then do not parse)."""
    payloads = [relevance.build_payload(request, card) for card in cards]
    calls = [(relevance.build_messages(p, system_prompt=system_prompt),
              lambda text, p=p: relevance.parse_for_input(text, p)) for p in payloads]
    if scored:
        answered = roles.call_batch(relevance.ROLE, calls, attempt, prefill=relevance.SCORE_PREFIX,
                                    max_new_tokens=max_new_tokens, extra={"mode": relevance.MODE},
                                    first_token_logprobs=relevance.YES_TOKENS + relevance.NO_TOKENS)
    else:
        answered = roles.call_batch(relevance.ROLE, calls, attempt,
                                    prefill=relevance.RESPONSE_PREFIX if prefill and not constrained else "",
                                    schema=relevance.output_schema() if constrained else None,
                                    max_new_tokens=max_new_tokens,
                                    extra={"mode": relevance.MODE})
    judgements = []
    for rank, (card, call) in enumerate(zip(cards, answered)):
        p = relevance.p_applies(call.generation.meta.get("first_token_logprobs"))
        if call.ok:
            value = call.result.value
            judgements.append(Judgement(card["name"], rank, value.applies, value.how,
                                        p=p if p is not None else float(value.applies)))
        else:
            judgements.append(Judgement(card["name"], rank, False, error=call.result.error, p=p))
    return judgements


def select(judgements: list[Judgement], shown: int = SHOWN) -> list[str]:
    """The candidates that apply, best ToolFace rank first, at most ``shown``."""
    applying = sorted((j for j in judgements if j.applies), key=lambda j: j.rank)
    return [j.name for j in applying[:shown]]


def prune(judgements: list[Judgement], default: list[str], thresholds: Thresholds,
          shown: int = SHOWN) -> list[str]:
    """ToolFace's ``default`` list less the tools scored below ``prune_below``, then (while
    fewer than ``shown``) the candidates outside it scored at least ``add_above``, best
    ToolFace rank first. A tool with no score stays as it is: in the list if it was."""
    by_name = {j.name: j for j in judgements}

    def score(name: str) -> float | None:
        return by_name[name].p if name in by_name else None

    kept = [name for name in default if score(name) is None or score(name) >= thresholds.prune_below]
    if thresholds.add_above is not None:
        for j in sorted(judgements, key=lambda j: j.rank):
            if len(kept) >= shown:
                break
            if j.name not in default and j.p is not None and j.p >= thresholds.add_above:
                kept.append(j.name)
    return kept


def calibrate(turns: list[tuple[list[str], list[Judgement], set[str]]], recall: float = 0.99,
              add_precision: float = 0.5) -> Thresholds:
    """The prune policy's thresholds from held-out turns, each ``(default list, the
    candidates' judgements, gold tools)``: ``prune_below`` the highest score that keeps at
    least ``recall`` of the gold tools the default lists hold (ties kept), ``add_above`` the
    lowest score whose additions (candidates outside the list scored at least it) are gold
    at least ``add_precision`` of the time and include one; None when no score does."""
    kept_scores, outside = [], []
    for default, judgements, gold in turns:
        listed = set(default)
        for j in judgements:
            if j.p is None:
                continue
            if j.name in listed:
                if j.name in gold:
                    kept_scores.append(j.p)
            else:
                outside.append((j.p, j.name in gold))
    kept_scores.sort()
    may_lose = math.floor((1 - recall) * len(kept_scores) + 1e-9)
    prune_below = kept_scores[may_lose] if kept_scores else 0.0
    add_above, hits = None, 0
    ranked = sorted(outside, key=lambda x: -x[0])
    for i, (p, is_gold) in enumerate(ranked):
        hits += is_gold
        if i + 1 < len(ranked) and ranked[i + 1][0] == p:
            continue  # a threshold takes every candidate with the same score
        if hits and hits / (i + 1) >= add_precision:
            add_above = p
    return Thresholds(prune_below, add_above, {
        "turns": len(turns), "gold_tools_listed": len(kept_scores), "recall_target": recall,
        "gold_tools_pruned": sum(p < prune_below for p in kept_scores),
        "outside_candidates": len(outside), "add_precision_target": add_precision,
        "added": sum(p >= add_above for p, _ in outside) if add_above is not None else 0,
        "added_gold": sum(g for p, g in outside if add_above is not None and p >= add_above)})


def relevant_tools(roles: RoleClient, toolface: ToolFace, request: str, candidates: int = CANDIDATES,
                   shown: int = SHOWN, thresholds: Thresholds | None = None, retrieve_k: int | None = None,
                   **options: Any) -> tuple[list[str], list[Judgement]]:
    """(the tools the Planner is shown, every candidate's judgement) for ``request``: the
    gate policy, or with ``thresholds`` the prune policy over ToolFace's default list
    (``retrieve(request, retrieve_k)``)."""
    names = [name for name, _ in toolface.search(request, candidates)]
    if thresholds is None:
        judgements = judge(roles, request, candidate_cards(toolface, names), **options)
        return select(judgements, shown), judgements
    judgements = judge(roles, request, candidate_cards(toolface, names), scored=True, **options)
    default = [t.name for t in toolface.retrieve(request, retrieve_k)]
    return prune(judgements, default, thresholds, shown), judgements
