"""Rollouts: a harness run over a set of tasks through the real loop, with exact replay.

A rollout is one episode of one task (:func:`heart_distill.eval.e2e.run_one`: the same loop
configuration and the same benchmark checker as ``heart eval e2e``). Every role call goes
through a :class:`ReplayBackend`, which answers a call whose exact messages (role, system
prompt, input, decoding settings) were answered before from that record, and asks the model
otherwise. Decoding is greedy, so a recorded answer is the answer the model would give —
replay is exact exactly when every role call of an episode finds its messages recorded.
For a middleware candidate that means: no intercept of the new set changes any envelope a
role sees (a call it corrects or blocks changes the Verifier's input, and from there on
the model is asked again). A prompt edit changes its role's every input, so it never
replays. The one caveat: batched decoding on some engines may differ from unbatched in the
last bits of arithmetic; the first answer recorded for a message is the one reused.

Costs are counted per optimizer run, not per process: an episode costs one *inner
rollout* (PRISM's budget unit) when at least one of its role calls was not in this run's
own record, even if another run had already computed it (the shared record then only
saves wall time). An episode that is an exact replay of this run's record costs nothing.
"""

from __future__ import annotations

import hashlib
import json
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from heart.runtime.base import Generation, SamplingConfig


def call_key(model: str, role: str, messages: Sequence[dict[str, str]], sampling: SamplingConfig | None) -> str:
    s = sampling or SamplingConfig()
    body = json.dumps([model, role, list(messages), s.max_new_tokens, s.temperature, s.top_p, s.seed,
                       s.guided_json], ensure_ascii=False, sort_keys=True)
    return hashlib.sha256(body.encode()).hexdigest()


class AnswerRecord:
    """Recorded answers, keyed by :func:`call_key`, optionally persisted as JSON lines
    (appended per answer; a torn last line is skipped on load)."""

    def __init__(self, path: str | Path | None = None):
        self.path = Path(path) if path else None
        self.answers: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        if self.path is not None and self.path.is_file():
            for line in self.path.read_text(encoding="utf-8").splitlines():
                try:
                    row = json.loads(line)
                except ValueError:
                    continue
                self.answers[row["key"]] = row

    def get(self, key: str) -> dict[str, Any] | None:
        return self.answers.get(key)

    def put(self, key: str, generation: Generation) -> None:
        row = {"key": key, "text": generation.text, "prompt_tokens": generation.prompt_tokens,
               "completion_tokens": generation.completion_tokens, "adapter": generation.adapter}
        with self._lock:
            if key in self.answers:
                return
            self.answers[key] = row
            if self.path is not None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                with open(self.path, "a", encoding="utf-8") as f:
                    f.write(json.dumps(row, ensure_ascii=False) + "\n")


class ReplayBackend:
    """A backend that replays recorded answers and asks ``inner`` for the rest.

    ``shared`` is the record every run of a model reads and writes (wall time); ``seen`` is
    this optimizer run's own set of answered calls (its budget). Each Generation's meta
    says ``replayed`` (in this run's record) and ``cached`` (in the shared record)."""

    def __init__(self, inner: Any, model_label: str, shared: AnswerRecord | None = None):
        self.inner = inner
        self.model_label = model_label
        self.shared = shared or AnswerRecord()
        self.seen: set[str] = set()
        self.name = getattr(inner, "name", "model")
        self.computed = 0
        """Role calls the model actually decoded (not in the shared record)."""

    def generate(self, role: str, messages, sampling: SamplingConfig | None = None) -> Generation:
        key = call_key(self.model_label, role, messages, sampling)
        replayed = key in self.seen
        row = self.shared.get(key)
        if row is None:
            generation = self.inner.generate(role, messages, sampling)
            self.shared.put(key, generation)
            self.computed += 1
            meta = {"replayed": replayed, "cached": False}
        else:
            generation = Generation(text=row["text"], backend=self.name, adapter=row.get("adapter"),
                                    prompt_tokens=row["prompt_tokens"], completion_tokens=row["completion_tokens"])
            meta = {"replayed": replayed, "cached": True}
        self.seen.add(key)
        return Generation(text=generation.text, backend=generation.backend, adapter=generation.adapter,
                          prompt_tokens=generation.prompt_tokens, completion_tokens=generation.completion_tokens,
                          latency_s=generation.latency_s, meta={**generation.meta, **meta})

    def client(self):
        import contextlib

        client = getattr(self.inner, "client", None)
        return client() if client is not None else contextlib.nullcontext()


@dataclass(frozen=True)
class TaskRef:
    """One task of one pre-declared condition (``bfcl:simple``, ``agentdojo:banking``)."""

    condition: str
    task_id: str

    @property
    def key(self) -> str:
        return f"{self.condition}|{self.task_id}"


@dataclass
class Episode:
    """What one rollout left: its score, its cost and the trace rows the analyst reads."""

    task: TaskRef
    score: float
    errored: bool
    rollout: bool
    """It cost an inner rollout (some role call was not in the run's record)."""
    model_calls: int
    tokens: int
    row: dict[str, Any]
    events: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Evaluation:
    """A harness on a task set: per-task scores and what it cost."""

    episodes: dict[str, Episode]

    @property
    def pass_rate(self) -> float:
        return sum(e.score for e in self.episodes.values()) / max(len(self.episodes), 1)

    @property
    def rollouts(self) -> int:
        return sum(e.rollout for e in self.episodes.values())

    @property
    def tokens(self) -> int:
        return sum(e.tokens for e in self.episodes.values() if e.rollout)

    def scores(self) -> dict[str, float]:
        return {k: e.score for k, e in self.episodes.items()}

    def by_condition(self) -> dict[str, float]:
        out: dict[str, list[float]] = {}
        for e in self.episodes.values():
            out.setdefault(e.task.condition, []).append(e.score)
        return {c: sum(v) / len(v) for c, v in out.items()}


RunEpisode = Callable[[TaskRef, str | None, Any], tuple[dict[str, Any], list[dict[str, Any]]]]
"""(task, harness folder or None, backend) → (episode row, trace rows): what runs one rollout."""


def evaluate(tasks: Iterable[TaskRef], harness_dir: str | None, backend: ReplayBackend, run_episode: RunEpisode,
             concurrency: int = 1) -> Evaluation:
    """Roll the harness in ``harness_dir`` out on every task (an errored episode scores 0 and
    is marked; the caller decides what it means)."""

    def one(task: TaskRef) -> Episode:
        row, events = run_episode(task, harness_dir, backend)
        calls = [e for e in events if e.get("kind") != "episode"]
        fresh = [e for e in calls if not (e.get("extra") or {}).get("replayed")]
        return Episode(task, float(row.get("score") or 0.0), bool(row.get("errored")), bool(fresh), len(fresh),
                       sum(e.get("prompt_tokens", 0) + e.get("completion_tokens", 0) for e in fresh), row, events)

    tasks = list(tasks)
    if concurrency <= 1:
        episodes = [one(t) for t in tasks]
    else:
        with ThreadPoolExecutor(max_workers=concurrency) as pool:
            episodes = list(pool.map(one, tasks))
    return Evaluation({e.task.key: e for e in episodes})
