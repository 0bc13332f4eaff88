"""One optimizer run: the evolutionary search over harnesses, on repair and gate data only.

    seed harness → evaluate on repair and gate
    for each generation:
        parent ← a frontier member (seeded choice)
        clusters ← failure clusters of the parent's repair episodes, routed to slots
        for each mutation m (slots middleware, prompt, joint in turn):
            candidate ← proposer(parent, slot, a cluster of that slot)
            repair: roll it out on the repair tasks; no repair gain over the parent → rejected
            gate:   roll it out on the gate tasks → gate pass rate and reliability
            the population keeps the Pareto frontier (capped)
    selection: the frontier member with the highest gate pass rate (then reliability, then the
    earlier candidate id)

Reliability is the share of gate tasks the candidate does not score lower on than the seed
harness does (1.0 for the seed): a harness that wins some tasks by losing others is less
reliable. Dominance uses gate pass rate and reliability only — the repair score is left out,
it is what the proposer looked at. The budget B counts inner rollouts
(:mod:`heart_distill.eval.optimize.rollouts`); an evaluation that could overrun it is not
started, and a proposal that is unusable costs one rollout. :func:`min_budget` is the B below
which no candidate is sure to be gated; the search refuses one under it. The scorecard is
never seen here.

Every mutation slot ends in one outcome (:data:`OUTCOMES`), or is never filled because the
search stopped first; the result counts them (:attr:`SearchResult.proposals`), so a run that
gated nothing says why.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from heart.harness import Harness, save_harness
from heart_distill.eval.optimize.clusters import SLOTS, Cluster, cluster
from heart_distill.eval.optimize.rollouts import Evaluation, TaskRef


@dataclass
class Candidate:
    id: str
    harness: Harness
    parent: str | None
    slot: str | None
    cluster: str | None
    rationale: str
    folder: str
    repair: Evaluation | None = None
    gate: Evaluation | None = None
    reliability: float | None = None
    status: str = "proposed"
    """proposed | gated | rejected (repair) | out of budget (repair) | out of budget (gate)"""

    @property
    def gate_pass(self) -> float:
        return self.gate.pass_rate if self.gate is not None else float("-inf")

    def dominates(self, other: "Candidate") -> bool:
        a, b = (self.gate_pass, self.reliability), (other.gate_pass, other.reliability)
        return a[0] >= b[0] and a[1] >= b[1] and a != b

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "parent": self.parent, "slot": self.slot, "cluster": self.cluster,
                "rationale": self.rationale, "describe": self.harness.describe(), "fingerprint": self.harness.fingerprint(),
                "folder": self.folder, "status": self.status,
                "repair_pass": self.repair.pass_rate if self.repair else None,
                "repair_scores": self.repair.scores() if self.repair else None,
                "gate_pass": self.gate.pass_rate if self.gate else None,
                "gate_by_condition": self.gate.by_condition() if self.gate else None,
                "gate_scores": self.gate.scores() if self.gate else None,
                "reliability": self.reliability}


@dataclass
class SearchConfig:
    generations: int = 10
    mutations: int = 3
    population: int = 5
    budget: int = 200
    """B: inner rollouts this run may spend before the scorecard."""
    slots: tuple[str, ...] = SLOTS
    """The mutation slots the run fills, in turn (("middleware",): the middleware surface alone)."""


# -- the budget rule: what B must pay for, from the accounting in search() ----------------

def worst_case_rollouts(n_tasks: int) -> int:
    """What one evaluation on ``n_tasks`` tasks may be charged: one rollout per episode, when
    none of them replays (a prompt edit never does). search() starts an evaluation only when
    the budget left covers this, since an evaluation cannot stop half-way."""
    return n_tasks


def min_budget(n_repair: int, n_gate: int, candidates: int = 1) -> int:
    """The smallest B under which search() takes its first ``candidates`` usable proposals all
    the way (repair, then gate when the repair improves) whatever replay saves: the seed's
    episodes are all fresh (the run's record starts empty), and each candidate is started on
    its repair tasks only when their worst case is left, then on its gate tasks only when
    theirs is. Unusable proposals cost one rollout each on top. For 4 repair + 4 gate tasks:
    16 for one candidate, 24 for two."""
    one_harness = worst_case_rollouts(n_repair) + worst_case_rollouts(n_gate)
    return one_harness * (1 + candidates)


def budget_error(budget: int, n_repair: int, n_gate: int) -> str | None:
    """Why B cannot pay for the seed harness plus one gated candidate, with the arithmetic;
    None when it can."""
    needed = min_budget(n_repair, n_gate)
    if budget >= needed:
        return None
    seed = worst_case_rollouts(n_repair) + worst_case_rollouts(n_gate)
    return (f"budget {budget} < {needed} = seed {seed} ({n_repair} repair + {n_gate} gate episodes) "
            f"+ one candidate's {n_repair} repair + {n_gate} gate episodes: an evaluation starts only when "
            f"the budget left pays for each of its episodes, and a prompt edit replays none, so under "
            f"{needed} no candidate is sure to be gated and the run would return the seed harness")


# -- what became of each mutation slot ----------------------------------------------------

OUTCOMES = ("gated", "rejected (repair)", "out of budget (repair)", "out of budget (gate)", "duplicate",
            "bad proposal", "no proposal")
"""How a mutation slot the proposer was asked to fill ends: gated, or why not — no repair gain
over the parent, the budget left could not pay for its repair or gate evaluation, a harness
already tried, an answer that could not be used; or the proposer had nothing for the slot."""

NO_PROPOSAL = "no proposal"


def proposal_tally(outcomes: dict[str, str], planned: int, stopped: str | None) -> dict[str, Any]:
    """Counts per run, which add up: planned = gated + sum(not_gated) + sum(unfilled).

    ``proposed`` are the slots that got a harness or an unusable answer; ``not_gated`` says why
    each proposal that was not gated was not; ``unfilled`` why the other slots got no proposal
    (the proposer had none for the slot, or the search stopped first: ``stopped``)."""
    count = Counter(outcomes.values())
    not_gated = {o: count[o] for o in OUTCOMES if o not in ("gated", NO_PROPOSAL) and count[o]}
    unfilled = {NO_PROPOSAL: count[NO_PROPOSAL]} if count[NO_PROPOSAL] else {}
    if planned > len(outcomes):
        unfilled[f"not asked: {stopped or 'the search ended'}"] = planned - len(outcomes)
    return {"planned": planned, "proposed": len(outcomes) - count[NO_PROPOSAL], "gated": count["gated"],
            "not_gated": not_gated, "unfilled": unfilled, "outcome": dict(outcomes)}


def describe_tally(tally: dict[str, Any]) -> str:
    """One line, e.g. 'proposed 5 of 6 slots, gated 1; not gated: 4 rejected (repair); unfilled: 1 no proposal'."""
    parts = [f"proposed {tally['proposed']} of {tally['planned']} slots, gated {tally['gated']}"]
    for key in ("not_gated", "unfilled"):
        if tally[key]:
            parts.append(key.replace("_", " ") + ": " + ", ".join(f"{k} {why}" for why, k in tally[key].items()))
    return "; ".join(parts)


@dataclass
class SearchResult:
    selected: Candidate
    seed: Candidate
    candidates: list[Candidate]
    frontier: list[str]
    why: str
    spent: dict[str, int] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)
    proposals: dict[str, Any] = field(default_factory=dict)
    """:func:`proposal_tally`: proposed, gated, and why each other slot was not gated."""

    @property
    def gate_lift(self) -> float:
        """G_i: the selected harness's gate pass rate minus the seed's, in points."""
        return 100.0 * (self.selected.gate_pass - self.seed.gate_pass)


Evaluate = Callable[[list[TaskRef], str], Evaluation]
"""(tasks, harness folder) → Evaluation: rolls a saved harness out (the run's backend)."""


def pareto(pool: list[Candidate]) -> list[Candidate]:
    return [c for c in pool if not any(o.dominates(c) for o in pool if o is not c)]


def select(frontier: list[Candidate]) -> Candidate:
    """The frontier's highest gate pass rate; ties: reliability, then the repair pass rate (a
    candidate is gated only for a repair gain over its parent: on a gate that cannot tell it
    from the seed, the repair evidence decides), then the earlier id."""
    return sorted(frontier, key=lambda c: (-c.gate_pass, -c.reliability, -_repair_pass(c), c.id))[0]


def _repair_pass(c: Candidate) -> float:
    return c.repair.pass_rate if c.repair is not None else float("-inf")


def reliability(gate: Evaluation, seed_gate: Evaluation) -> float:
    seed_scores = seed_gate.scores()
    scores = gate.scores()
    kept = sum(scores[k] >= seed_scores[k] for k in seed_scores)
    return kept / max(len(seed_scores), 1)


def search(seed_harness: Harness, repair: list[TaskRef], gate: list[TaskRef], evaluate: Evaluate,
           proposer: Any, catalogs: dict[str, list[Any]], config: SearchConfig, rng: random.Random,
           folder: Path, log: Callable[[dict[str, Any]], None] = lambda e: None) -> SearchResult:
    """Run the search (module docstring); candidate harnesses are saved under ``folder``."""
    spent = {"rollouts": 0, "tokens": 0, "proposer_tokens": 0, "bad_proposals": 0, "replayed_episodes": 0}
    events: list[dict[str, Any]] = []

    def note(event: dict[str, Any]) -> None:
        events.append(event)
        log(event)

    def charge(evaluation: Evaluation) -> None:
        spent["rollouts"] += evaluation.rollouts
        spent["tokens"] += evaluation.tokens
        spent["replayed_episodes"] += len(evaluation.episodes) - evaluation.rollouts

    def affordable(tasks: list[TaskRef]) -> bool:  # min_budget() counts on this rule
        return spent["rollouts"] + worst_case_rollouts(len(tasks)) <= config.budget

    outcomes: dict[str, str] = {}  # mutation id → its OUTCOMES entry
    stopped: str | None = None

    def out_of_budget(c: Candidate, stage: str, tasks: list[TaskRef]) -> None:
        c.status = outcomes[c.id] = f"out of budget ({stage})"
        note({"event": "out_of_budget", "id": c.id, "stage": stage, "budget": config.budget,
              "why": f"spent {spent['rollouts']} + {worst_case_rollouts(len(tasks))} {stage} episodes "
                     f"> B={config.budget}", "spent": dict(spent)})

    def saved(harness: Harness, cid: str) -> str:
        return str(save_harness(harness, folder / cid))

    seed = Candidate("c000", seed_harness, None, None, None, "the harness the run starts from", "")
    seed.folder = saved(seed_harness, seed.id)
    refused = budget_error(config.budget, len(repair), len(gate))
    if refused:
        raise ValueError(refused)
    seed.repair = evaluate(repair, seed.folder)
    charge(seed.repair)
    seed.gate = evaluate(gate, seed.folder)
    charge(seed.gate)
    seed.reliability = 1.0
    seed.status = "gated"
    note({"event": "seed", "repair_pass": seed.repair.pass_rate, "gate_pass": seed.gate.pass_rate,
          "spent": dict(spent)})
    candidates = [seed]
    population = [seed]
    fingerprints = {seed_harness.fingerprint(): seed.id}
    n = 0
    exhausted = False
    catalog = [spec for specs in catalogs.values() for spec in specs]
    for generation in range(config.generations):
        if exhausted:
            break
        frontier = pareto(population)
        parent = frontier[rng.randrange(len(frontier))] if len(frontier) > 1 else frontier[0]
        clusters = cluster(parent.repair.episodes.values())
        by_slot: dict[str, list[Cluster]] = {s: [c for c in clusters if c.slot == s] for s in SLOTS}
        note({"event": "generation", "generation": generation, "parent": parent.id,
              "clusters": [c.to_dict() for c in clusters[:8]]})
        if not clusters:
            stopped = f"parent {parent.id} fails no repair task"
            note({"event": "stop", "why": stopped})
            break
        for m in range(config.mutations):
            slot = config.slots[m % len(config.slots)]
            pool = by_slot[slot] or clusters  # an empty slot works on the largest clusters
            start = rng.randrange(min(3, len(pool)))
            n += 1
            cid = f"c{n:03d}"
            target, proposal, passed = _propose(proposer, parent.harness, slot, pool[start:] + pool[:start],
                                                catalog, cid, rng, fingerprints)
            spent["proposer_tokens"] += proposal.tokens
            if passed:
                note({"event": "next_cluster", "id": cid, "slot": slot, "passed": passed, "cluster": target.id})
            if proposal.error is not None:
                spent["bad_proposals"] += 1
                spent["rollouts"] += 1  # a proposal that cannot be used costs its rollout
                outcomes[cid] = "bad proposal"
                note({"event": "bad_proposal", "id": cid, "slot": slot, "cluster": target.id,
                      "error": proposal.error, "raw": proposal.raw[:500]})
                if spent["rollouts"] >= config.budget:
                    exhausted = True
                    break
                continue
            if proposal.harness is None:
                outcomes[cid] = NO_PROPOSAL
                note({"event": "no_proposal", "id": cid, "slot": slot, "cluster": target.id,
                      "why": proposal.rationale})
                continue
            fingerprint = proposal.harness.fingerprint()
            if fingerprint in fingerprints:
                outcomes[cid] = "duplicate"
                note({"event": "duplicate", "id": cid, "same_as": fingerprints[fingerprint]})
                continue
            fingerprints[fingerprint] = cid
            c = Candidate(cid, proposal.harness, parent.id, slot, target.id, proposal.rationale, "")
            c.folder = saved(proposal.harness, cid)
            candidates.append(c)
            if not affordable(repair):
                out_of_budget(c, "repair", repair)
                exhausted = True
                break
            c.repair = evaluate(repair, c.folder)
            charge(c.repair)
            if c.repair.pass_rate <= parent.repair.pass_rate:
                c.status = outcomes[cid] = "rejected (repair)"
                note({"event": "rejected", "id": cid, "repair_pass": c.repair.pass_rate,
                      "parent_repair_pass": parent.repair.pass_rate, "spent": dict(spent)})
                continue
            if not affordable(gate):
                out_of_budget(c, "gate", gate)
                exhausted = True
                break
            c.gate = evaluate(gate, c.folder)
            charge(c.gate)
            c.reliability = reliability(c.gate, seed.gate)
            c.status = outcomes[cid] = "gated"
            population.append(c)
            population = pareto(population)
            if len(population) > config.population:
                population = sorted(population, key=lambda x: (-x.gate_pass, -x.reliability, -_repair_pass(x), x.id))[:config.population]
            note({"event": "gated", "id": cid, "gate_pass": c.gate_pass, "reliability": c.reliability,
                  "spent": dict(spent)})
    if exhausted:
        stopped = f"the budget ran out ({spent['rollouts']} of B={config.budget} spent)"
    tally = proposal_tally(outcomes, config.generations * config.mutations, stopped)
    frontier = pareto(population)
    chosen = select(frontier)
    why = (f"{chosen.id}: highest gate pass rate on the Pareto frontier {[c.id for c in frontier]} "
           f"(gate {100 * chosen.gate_pass:.1f}% vs seed {100 * seed.gate_pass:.1f}%, reliability "
           f"{chosen.reliability:.2f}, repair {100 * _repair_pass(chosen):.1f}% vs seed "
           f"{100 * _repair_pass(seed):.1f}%; ties by reliability, then repair pass rate, then candidate id); "
           f"{describe_tally(tally)}")
    note({"event": "selected", "id": chosen.id, "why": why, "spent": dict(spent)})
    return SearchResult(chosen, seed, candidates, [c.id for c in frontier], why, spent, events, tally)


def _propose(proposer: Any, parent: Harness, slot: str, order: list[Cluster], catalog: list[Any], cid: str,
             rng: random.Random, tried: dict[str, str]) -> tuple[Cluster, Any, list[dict[str, str]]]:
    """The slot's proposal: from the first cluster of ``order``, and — for a proposer that
    costs nothing to ask (``exhaustive``: the deterministic rules) — first from the middleware
    slot's clusters together (``others``), then from the next cluster while one has no rule or
    repeats a harness already ``tried``, so a slot is not spent on what the run has seen while
    another cluster has a new edit. Returns the cluster used, its
    proposal, and the clusters passed over (with why)."""
    passed: list[dict[str, str]] = []
    exhaustive = getattr(proposer, "exhaustive", False)
    if exhaustive and slot == "middleware" and len(order) > 1:  # first the slot's clusters together
        proposal = proposer.propose(parent, slot, order[0], catalog, cid, rng, others=order[1:])
        if proposal.error is not None or (proposal.harness is not None and proposal.harness.fingerprint() not in tried):
            return order[0], proposal, passed
        passed.append({"cluster": f"{order[0].id} with {len(order) - 1} more",
                       "why": proposal.rationale if proposal.harness is None
                       else f"same harness as {tried[proposal.harness.fingerprint()]}"})
    for i, target in enumerate(order if exhaustive else order[:1]):
        proposal = proposer.propose(parent, slot, target, catalog, cid, rng)
        last = i == (len(order) - 1 if exhaustive else 0)
        if proposal.error is not None or last:
            return target, proposal, passed
        if proposal.harness is None:
            passed.append({"cluster": target.id, "why": proposal.rationale or "no proposal"})
        elif proposal.harness.fingerprint() in tried:
            passed.append({"cluster": target.id, "why": f"same harness as {tried[proposal.harness.fingerprint()]}"})
        else:
            return target, proposal, passed
    raise AssertionError("unreachable: the last cluster returns")


def write_log(result: SearchResult, path: Path, header: dict[str, Any]) -> None:
    from heart.atomic import publish_text

    doc = {**header, "selected": result.selected.id, "selected_folder": result.selected.folder,
           "why": result.why, "gate_lift": result.gate_lift, "seed_gate_pass": result.seed.gate_pass,
           "frontier": result.frontier, "spent": result.spent, "proposals": result.proposals,
           "candidates": [c.to_dict() for c in result.candidates], "events": result.events}
    publish_text(path, json.dumps(doc, indent=1, default=str) + "\n")
