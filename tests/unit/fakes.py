"""Test doubles for logic tests: a hashing embedder and a scripted role responder."""

from __future__ import annotations

import hashlib
import json
from typing import Any, Callable

import numpy as np

from heart.roles import primitive_messages
from heart.roles.common import render_answer, role_input


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
    """Answers role calls from per-role queues of strings or callables(payload) -> str.

    The Primitive's messages mode (:mod:`heart.roles.primitive_messages`) answers from the
    ``messages`` queue, recorded as role ``"messages"``; without one, with no messages."""

    def __init__(self, **queues: list[Any]):
        self.queues = {role: list(items) for role, items in queues.items()}
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, role: str, messages: list[dict[str, str]]) -> str:
        payload = role_input(messages)
        if role == "primitive" and primitive_messages.is_messages_input(payload):
            role = "messages"
            if role not in self.queues:
                self.calls.append((role, payload))
                return render_answer({"tool": payload["tool"], "messages": []})
        self.calls.append((role, payload))
        queue = self.queues.get(role)
        if not queue:
            raise AssertionError(f"unexpected {role} call with {payload}")
        item = queue.pop(0) if len(queue) > 1 else queue[0]
        out = item(payload) if callable(item) else item
        return out if isinstance(out, str) else render_answer(out)  # the form roles answer in

    def count(self, role: str) -> int:
        return sum(1 for r, _ in self.calls if r == role)


INTENT = {"task": "test", "objective": "test", "tool_categories": [], "constraints": []}


def plan(*steps: tuple, replanned: bool = False) -> dict:
    """A SUFFICIENT plan of (tool, objective[, dependencies]) steps."""
    return {"status": "SUFFICIENT", "intent": INTENT, "replanned": replanned,
            "plan": [{"step": i, "tool_category": "", "tool_hint": s[0], "objective": s[1],
                      "dependencies": list(s[2]) if len(s) > 2 else []} for i, s in enumerate(steps, 1)]}


def ask(question: str) -> dict:
    return {"status": "INSUFFICIENT", "intent": INTENT, "clarification": question, "replanned": False}


def dispatch(*items: tuple) -> dict:
    """A dispatch of (tool, bindings[, h_params]) entries."""
    return {"status": "READY", "dispatch": [
        {"step": i, "target_tool": item[0], "invocation_request": f"call {item[0]}", "resolved_bindings": item[1],
         "h_params": {"retry": 1, "priority": "normal", "timeout_s": 5, **(item[2] if len(item) > 2 else {})}}
        for i, item in enumerate(items, 1)]}


def args(tool: str, **arguments: Any) -> dict:
    return {"tool": tool, "arguments": arguments}


def echo_bindings(payload: dict) -> dict:
    """A primitive that passes the resolved bindings through as arguments."""
    return {"tool": payload["tool"]["name"], "arguments": payload["resolved_bindings"]}


def verdict(payload: dict, status: str = "PASS", feedback: str = "", failed: tuple = ()) -> dict:
    """A D.4 verdict on the (first) step of the Verifier's input, in the serving key order."""
    step = payload["steps"][0]["step"] if payload["steps"] else 0
    criteria = {c: "fail" if c in failed else "pass" for c in
                ("task_completion", "argument_consistency", "execution_validity", "constraint_satisfaction")}
    return {"step": step, "criteria": criteria, "status": status, "feedback": feedback}


def PASS(payload: dict) -> dict:
    return verdict(payload)


def fail(feedback: str):
    """A Verifier that fails the step it is shown with ``feedback``."""
    return lambda payload: verdict(payload, "FAIL", feedback, ("task_completion", "execution_validity"))


Responder = Callable[[str, list[dict[str, str]]], str]
