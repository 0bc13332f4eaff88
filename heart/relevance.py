"""Relevance before selection (HEELO): the candidates judge themselves, the Planner sees those that apply.

ToolFace ranks the request's candidates (its fused score, top ``candidates``, default 20:
every gold tool is among them far more often than among the 10 a Planner can be shown);
each candidate's Primitive, in its relevance mode (:mod:`heart.roles.relevance`), answers
``{"applies": ..., "how": ...}`` for the request, all candidates in one batch
(:meth:`heart.calls.RoleClient.call_batch`, one trace event each, ``extra["mode"] =
"relevance"``); the Planner is shown the candidates that apply, at most ``shown`` (10).

When more than ``shown`` apply, the ones ToolFace ranked highest are kept: ToolFace's rank
stands in for the model's confidence. The engines return text, not token probabilities
(llama.cpp's and peft's decoding loops would have to carry them out), so the probability
of ``true`` is not available without a second pass; the rank is free and is what a tie
between two applying tools falls back to anyway.

An answer that does not parse counts as "does not apply", and is recorded as unparsed
(:attr:`Judgement.error`, and the trace event's ``parse_error``).
"""

from __future__ import annotations

from dataclasses import dataclass
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


def candidate_cards(toolface: ToolFace, names: list[str]) -> list[dict[str, Any]]:
    """The relevance cards of ToolFace's candidates ``names``."""
    cards = []
    for name in names:
        spec = toolface.get(name).spec
        cards.append(relevance.relevance_card(name, spec.own_description(), spec.parameters))
    return cards


def judge(roles: RoleClient, request: str, cards: list[dict[str, Any]], attempt: int = 0,
          system_prompt: str = relevance.SYSTEM_PROMPT, prefill: bool = False,
          constrained: bool = False) -> list[Judgement]:
    """Ask every card's Primitive, in one batch, whether it applies to ``request``."""
    payloads = [relevance.build_payload(request, card) for card in cards]
    calls = [(relevance.build_messages(p, system_prompt=system_prompt),
              lambda text, p=p: relevance.parse_for_input(text, p)) for p in payloads]
    answered = roles.call_batch(relevance.ROLE, calls, attempt,
                                prefill=relevance.RESPONSE_PREFIX if prefill and not constrained else "",
                                schema=relevance.output_schema() if constrained else None,
                                max_new_tokens=relevance.MAX_NEW_TOKENS,
                                extra={"mode": relevance.MODE})
    judgements = []
    for rank, (card, call) in enumerate(zip(cards, answered)):
        if call.ok:
            judgements.append(Judgement(card["name"], rank, call.result.value.applies, call.result.value.how))
        else:
            judgements.append(Judgement(card["name"], rank, False, error=call.result.error))
    return judgements


def select(judgements: list[Judgement], shown: int = SHOWN) -> list[str]:
    """The candidates that apply, best ToolFace rank first, at most ``shown``."""
    applying = sorted((j for j in judgements if j.applies), key=lambda j: j.rank)
    return [j.name for j in applying[:shown]]


def relevant_tools(roles: RoleClient, toolface: ToolFace, request: str, candidates: int = CANDIDATES,
                   shown: int = SHOWN, **options: Any) -> tuple[list[str], list[Judgement]]:
    """(the tools the Planner is shown, every candidate's judgement) for ``request``."""
    names = [name for name, _ in toolface.search(request, candidates)]
    judgements = judge(roles, request, candidate_cards(toolface, names), **options)
    return select(judgements, shown), judgements
