"""One episode: every user turn of one task through the HEART loop, then the benchmark's score.

The episode id is a pure function of (environment, task id, seed, backend name), so a
resumed collection recognises the episodes it already finished.
"""

from __future__ import annotations

import hashlib
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from heart.catalog import session_toolface
from heart.calls import BackendError, EpisodeContext, RoleClient
from heart.environments.base import Environment, Task
from heart.ledger import COUNTERS
from heart.loop import HeartLoop, LoopConfig, Observer, TurnResult, quiet
from heart.primitives import contained_tool_calls, summarize
from heart.provenance import PROVENANCE_VIOLATION
from heart.runtime.base import Backend, SamplingConfig
from heart.traces import EpisodeRecord, TraceWriter


CONVERSATION_RESPONSE_CHARS = 600
"""How much of each earlier turn's response later turns see (the Planner sees less)."""


def episode_id(env: str, task_id: str, seed: int, backend: str) -> str:
    return hashlib.sha256(f"{env}\x00{task_id}\x00{seed}\x00{backend}".encode()).hexdigest()[:20]


@dataclass
class EpisodeResult:
    record: EpisodeRecord
    turns: list[TurnResult]


def run_episode(
    environment: Environment,
    task: Task,
    backend: Backend,
    *,
    config: LoopConfig = LoopConfig(),
    trace: TraceWriter | None = None,
    seed: int = 0,
    observe: Observer = quiet,
    ask_user: Callable[[str], str] | None = None,
    sampling: dict[str, SamplingConfig] | None = None,
    cache_dir: Path | None = None,
) -> EpisodeResult:
    """Run ``task`` turn by turn, score it with the benchmark's checker, trace everything.

    Infrastructure failures — the backend raising, the checker raising, a tool call
    abandoned on timeout, a session's ``infrastructure_failure`` (an MCP server that died or
    hung) — end in a record with ``errored=True`` (score 0, counted apart),
    never in an exception or a clean-looking model failure.
    """
    start = time.perf_counter()
    session = environment.start(task)
    # What the train split's gold teaches retrieval (companions, a query log, a usage
    # prior; the task's own turns left out): similarity alone misses tools no query names.
    toolface = session_toolface(environment, session, cache_dir=cache_dir)
    context = EpisodeContext(episode_id(task.env, task.task_id, seed, backend.name), task.task_id, task.env)
    # a session that exposes its state (AgentDojo, BFCL) gets state-change checks after its
    # state-changing calls (heart.validation); others (MCP servers) do not
    loop = HeartLoop(RoleClient(backend, context, trace, sampling), toolface,
                     ask_user or session.clarify, config, observe, state=session.state)

    conversation: list[dict[str, str]] = []
    turns: list[TurnResult] = []
    error: str | None = None
    with contained_tool_calls() as containment:
        try:
            for turn, query in enumerate(task.turns):
                if turn in session.answered_turns:  # the user gave it as a clarification's
                    continue  # answer in the turn before (BFCL miss_param): it ran there
                context.turn = turn
                session.start_turn(turn)
                observe("turn", {"turn": turn, "query": query})
                result = loop.solve(query, conversation)
                session.finish_turn(turn, result.response)
                observe("turn_end", {"turn": turn, "result": result})
                turns.append(result)
                # what the user said in the turn: the query, then each answer to a clarification
                user = "\n".join([query, *(c["answer"] for c in result.clarifications)])
                conversation.append({"user": user, "response": summarize(result.response, CONVERSATION_RESPONSE_CHARS)})
        except BackendError as err:
            error = f"backend: {err}"
        except Exception as err:  # the loop or the environment broke: not the model's doing
            where = traceback.extract_tb(err.__traceback__)[-1]
            error = f"episode: {type(err).__name__}: {err} (at {Path(where.filename).name}:{where.lineno})"
        if error is None and containment.abandoned:
            error = f"tool: {containment.abandoned}"
        # A session whose tools' infrastructure failed (an MCP server that died, hung or
        # answered garbage: heart.environments.mcp) says why; its episode proves nothing.
        if error is None and session.infrastructure_failure:
            error = f"tool: {session.infrastructure_failure}"

    score = None
    if error is None:
        try:
            score = session.score()
        except Exception as err:
            error = f"checker: {type(err).__name__}: {err}"
    try:
        session.close()  # a session holding a connection or a process (MCP)
    except Exception:  # the episode is over and scored: a failed close changes nothing
        pass
    record = EpisodeRecord(
        episode_id=context.episode_id,
        task_id=task.task_id,
        env=task.env,
        score=score.score if score is not None else 0.0,
        success=score.success if score is not None else False,
        verdicts=[t.verdict for t in turns],
        replans_used=[t.replans_used for t in turns],
        checker=score.details if score is not None else {},
        backend=backend.name,
        seed=seed,
        wall_s=round(time.perf_counter() - start, 3),
        errored=error is not None,
        error=error,
        **{name: sum(t.counts[name] for t in turns) for name in COUNTERS},
        tools_refused=list(toolface.refusals),
        provenance_violations=sum(r.failure_type == PROVENANCE_VIOLATION and not r.reused
                                  for t in turns for a in t.attempts for r in a.results.values()),
    )
    if trace is not None:
        trace.write(record)
    observe("score", {"record": record})
    return EpisodeResult(record, turns)
