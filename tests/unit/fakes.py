"""Test doubles for logic tests: a hashing embedder and a scripted role responder."""

from __future__ import annotations

import hashlib
import json
from typing import Any, Callable

import numpy as np

from heart.roles.common import role_input


class HashingEmbedder:
    """Bag-of-words hashed into 384 dims: deterministic, instant, no model."""

    dim = 384

    def _vector(self, text: str) -> np.ndarray:
        v = np.zeros(self.dim, dtype=np.float32)
        for word in text.lower().replace(":", " ").replace(".", " ").split():
            v[int(hashlib.md5(word.encode()).hexdigest(), 16) % self.dim] += 1.0
        n = np.linalg.norm(v)
        return v / n if n else v

    def embed(self, texts: list[str]) -> np.ndarray:
        return np.stack([self._vector(t) for t in texts])

    def embed_query(self, text: str) -> np.ndarray:
        return self._vector(text)[None, :]


class Script:
    """Answers role calls from per-role queues of strings or callables(payload) -> str."""

    def __init__(self, **queues: list[Any]):
        self.queues = {role: list(items) for role, items in queues.items()}
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, role: str, messages: list[dict[str, str]]) -> str:
        payload = role_input(messages)
        self.calls.append((role, payload))
        queue = self.queues.get(role)
        if not queue:
            raise AssertionError(f"unexpected {role} call with {payload}")
        item = queue.pop(0) if len(queue) > 1 else queue[0]
        out = item(payload) if callable(item) else item
        return out if isinstance(out, str) else json.dumps(out)

    def count(self, role: str) -> int:
        return sum(1 for r, _ in self.calls if r == role)


def plan(*steps: tuple[str, str]) -> dict:
    return {"status": "SUFFICIENT", "intent": "test",
            "plan": [{"step": i, "tool": t, "objective": o, "depends_on": []} for i, (t, o) in enumerate(steps, 1)]}


def dispatch(*items: tuple[str, dict]) -> dict:
    return {"status": "READY", "dispatch": [
        {"step": i, "target_tool": t, "invocation_request": f"call {t}", "resolved_bindings": b,
         "h_params": {"retry": 0, "priority": 0, "timeout_s": 5}} for i, (t, b) in enumerate(items, 1)]}


def args(tool: str, **arguments: Any) -> dict:
    return {"tool": tool, "arguments": arguments}


def echo_bindings(payload: dict) -> dict:
    """A primitive that passes the resolved bindings through as arguments."""
    return {"tool": payload["tool"]["name"], "arguments": payload["resolved_bindings"]}


PASS = {"verdict": "PASS", "criteria": {"task_completion": True, "argument_consistency": True,
                                        "execution_validity": True, "constraint_satisfaction": True},
        "feedback": "", "response": "done"}


def fail(feedback: str) -> dict:
    return {"verdict": "FAIL", "criteria": {"task_completion": False, "argument_consistency": True,
                                            "execution_validity": False, "constraint_satisfaction": True},
            "feedback": feedback, "response": ""}


Responder = Callable[[str, list[dict[str, str]]], str]
