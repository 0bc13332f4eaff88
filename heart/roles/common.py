"""What the four roles share: rendering an input block, and extracting + validating JSON.

Every role is one prompt template, one parser and one output model. A parser never raises
on bad model output: it returns a :class:`ParseResult` whose ``error`` says what was wrong,
and the loop records it as a failed role call.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Generic, Iterator, TypeVar

from pydantic import BaseModel, ValidationError

T = TypeVar("T", bound=BaseModel)

_THINK = re.compile(r"<think>.*?</think>", re.DOTALL)


def render_input(instruction: str, payload: dict[str, Any]) -> str:
    """The user message of a role call: one instruction line, then the input as one JSON line.

    Keeping the input as JSON makes every role call machine-readable for teachers and
    dataset filters, and gives students one stable shape to learn. It is rendered compactly
    (no indentation, no spaces after separators, no ``INPUT:`` label or code fence around
    it): those are tokens a student pays for on every example and learns nothing from.
    """
    block = json.dumps(payload, ensure_ascii=False, separators=(",", ":"), default=str)
    return f"{instruction}\n{block}"


def build_role_messages(system_prompt: str, instruction: str, payload: dict[str, Any]) -> list[dict[str, str]]:
    """A role call's messages: the role's system prompt, then one user message holding the
    instruction and the input (:func:`render_input`). Each role's ``build_messages`` calls
    this with its own prompt and instruction."""
    return [
        {"role": "system", "content": system_prompt},
        {"role": "user", "content": render_input(instruction, payload)},
    ]


_FENCED = "INPUT:\n```json\n"
"""The older fenced rendering of role inputs: still read, so traces written with it still build."""


def read_input(user_message: str) -> dict[str, Any]:
    """Inverse of :func:`render_input`: the JSON payload of a role call's user message
    (also of the older fenced rendering)."""
    if _FENCED in user_message:
        start = user_message.index(_FENCED) + len(_FENCED)
        return json.loads(user_message[start:user_message.rindex("\n```")])
    return json.loads(user_message[user_message.index("\n") + 1:])


def role_input(messages: list[dict[str, str]]) -> dict[str, Any]:
    """The JSON payload of a role call (its last user message; a prefill may follow it)."""
    return read_input(next(m["content"] for m in reversed(messages) if m["role"] == "user"))


ANSWER_SEPARATORS = (", ", ": ")
"""How answers are written: teachers render with them, the serving grammar
(:mod:`heart.runtime.hf`) enforces them, prefills and system prompts show them. Inputs are
compact, answers keep ``json.dumps``' default spacing. Two whole SmolLM2 pipeline runs on
the same held-out tasks, before and after compacting inputs *and* answers: the distilled
Router fell from 25% to 7% binding EM (unparseable answers 6% → 69%: nested bindings until
the token budget) and the Planner from 37.5% to 12.5% tool-sequence EM. Of those changes,
the separators are the one that alters what a student must *generate*, in a form the base
model rarely saw in pre-training; they cost a Planner answer ~15 tokens."""


def render_answer(answer: dict[str, Any]) -> str:
    """An answer as a role writes it (the form the serving grammar allows)."""
    return json.dumps(answer, ensure_ascii=False, separators=ANSWER_SEPARATORS)


def clip_words(text: str, limit: int, ellipsis: str = "…") -> str:
    """``text`` on one line, at most ``limit`` characters, cut at a word boundary (with
    ``ellipsis`` appended) when too long: a cut word is tokens that carry nothing."""
    text = " ".join(str(text).split())
    if len(text) <= limit:
        return text
    head = text[: limit - len(ellipsis) + 1]
    cut = head.rsplit(" ", 1)[0] if " " in head else head[:-1]
    return cut[: limit - len(ellipsis)].rstrip(" ,;:") + ellipsis


FUNCTION_WORDS = frozenset("a an the of to in on for from with and or by at any its their that which".split())
"""Words a clipped phrase does not end on, and that do not make a description say more."""


def clip_phrase(text: str, limit: int) -> str:
    """The first words of ``text`` (on one line), at most ``limit`` characters and not
    ending on a function word: "Get the login status of the current user" → "Get the
    login status". For short labels, where an ellipsis would be a token saying nothing."""
    text = " ".join(str(text).split())
    if len(text) <= limit:
        return text
    words = clip_words(text, limit, ellipsis="").split()
    while len(words) > 1 and words[-1].lower().strip(",;:") in FUNCTION_WORDS:
        words.pop()
    return " ".join(words).rstrip(",;:")


CLIPPED_MARKS = ("…", "...")
"""What a cut-off clause ends with: no natural-language field a teacher writes carries one."""

_DANGLING = frozenset("a an the of and or its their".split())
"""Words a whole sentence does not end on ("Get the list of users in the."); prepositions that
end phrasal verbs ("help with", "put in", "mode: on") are left out."""


def is_clipped(text: Any) -> bool:
    """Whether ``text`` holds a clause cut off: an ellipsis, or a last word that leaves its
    phrase open (an article or preposition)."""
    if not isinstance(text, str):
        return False
    words = text.rstrip(" .?!").split()
    return any(mark in text for mark in CLIPPED_MARKS) or bool(words) and words[-1].lower() in _DANGLING


def whole_parts(parts: list[str], render, limit: int) -> str:
    """``render(parts[:n])`` for the largest ``n`` whose text fits in ``limit`` characters
    (``render([])`` when none does): parts are kept or dropped whole, never cut, so every
    sentence a teacher writes is complete."""
    n = len(parts)
    while n > 0 and len(render(parts[:n])) > limit:
        n -= 1
    return render(parts[:n])


_CONJUNCTIONS = {"and", "then", "but", "so", "or"}
_CLAUSE_END = re.compile(r"\s*(?:[,;:]\s+|\s+(?:and|then|but|so)\s+)")


def first_clause(sentence: str, limit: int) -> str:
    """``sentence`` (one line) when it fits in ``limit`` characters; else its longest run of
    leading clauses that fits (cut at ", ", "; ", " and ", " then "…), ended with a period;
    else "" — a whole clause or nothing, never half of one."""
    sentence = " ".join(str(sentence).split())
    if len(sentence) <= limit:
        return sentence
    best = ""
    for match in _CLAUSE_END.finditer(sentence):
        head = sentence[:match.start()].rstrip(" ,;:")
        while head.rsplit(" ", 1)[-1].lower() in _CONJUNCTIONS:  # ", and then": the clause before both
            head = head.rsplit(" ", 1)[0].rstrip(" ,;:") if " " in head else ""
        if not head:
            continue
        if len(head) + 1 > limit:
            break
        best = head + ("" if head.endswith((".", "?", "!")) else ".")
    return best


_PHRASE_BREAKS = frozenset("to for with in on from by at that which when where if using given into".split())


def lead_phrase(text: str, limit: int, stretch: float = 1.5) -> str:
    """The leading phrase of ``text`` (one line) within ``limit`` characters: the text when it
    fits; else its words before the last preposition or relative word that leaves a phrase
    within ``limit``, without a trailing function word ("Get the list of users in the given
    channel" → "Get the list of users"); else, when no break fits, the whole text when it is
    at most ``stretch`` × ``limit`` ("Get the list of the most recent transactions"): a whole
    phrase rather than one cut in its middle. :func:`clip_phrase` only past that."""
    text = " ".join(str(text).split())
    if len(text) <= limit:
        return text
    words = text.split()
    for i in range(len(words) - 1, 1, -1):
        if words[i].lower() not in _PHRASE_BREAKS:
            continue
        head = words[:i]
        while len(head) > 1 and head[-1].lower().strip(",;:") in FUNCTION_WORDS | _PHRASE_BREAKS:
            head.pop()
        phrase = " ".join(head).rstrip(",;:")
        if len(head) > 1 and len(phrase) <= limit:
            return phrase
    return text if len(text) <= stretch * limit else clip_phrase(text, limit)


def quoted_value(value: Any) -> str:
    """A value inside natural-language text, quoted with single quotes: escaped double quotes
    inside JSON strings are what the serving grammar handles worst."""
    if isinstance(value, str):
        return "'" + value.replace('"', "'") + "'"
    return json.dumps(value, ensure_ascii=False).replace('"', "'")


MAX_JSON_CANDIDATES = 256
"""How many ``{`` positions a parser tries as the start of the answer before giving up."""


def _json_candidates(text: str) -> Iterator[tuple[Any, str | None]]:
    """(value, None) or (None, decode error) for each ``{`` that may start the answer.

    Bounded, so that no output costs more than a few passes over it: at most
    ``MAX_JSON_CANDIDATES`` starts, and decoding stops once it has read 4× the text
    (``'{"a": ' * 20000`` around an answer took 6 s when every start was tried in full).
    """
    decoder = json.JSONDecoder()
    budget = 4 * len(text) + 10_000
    position = text.find("{")
    for _ in range(MAX_JSON_CANDIDATES):
        if position < 0 or budget <= 0:
            return
        try:
            value, end = decoder.raw_decode(text, position)
        except json.JSONDecodeError as err:
            budget -= max(err.pos - position, 1)
            value, error = None, f"{err.msg} at char {err.pos}"
        except RecursionError:  # nesting deeper than the decoder goes: not an answer
            budget -= len(text) - position
            value, error = None, f"nested too deeply at char {position}"
        else:
            budget -= end - position
            error = None
        yield value, error
        position = text.find("{", position + 1)


def extract_json_object(text: str) -> dict[str, Any]:
    """The first JSON object in ``text`` (after dropping any <think> block and code fences).

    Raises ValueError with a short reason when there is none.
    """
    last_error = None
    for value, error in _json_candidates(_THINK.sub("", text)):
        if error is None and isinstance(value, dict):
            return value
        last_error = error or last_error
    if last_error is None:
        raise ValueError("no JSON object in the output")
    raise ValueError(f"no valid JSON object in the output ({last_error})")


@dataclass(frozen=True)
class ParseResult(Generic[T]):
    """A parsed role output, or the reason it could not be parsed."""

    value: T | None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def parse_model(text: str, model: type[T]) -> ParseResult[T]:
    """The first JSON object in ``text`` that validates against ``model``.

    When none does, the error is the one of the outermost candidate (the first ``{``): a
    truncated answer reports its decode error, not a schema error about some object
    nested inside it.
    """
    first_error: str | None = None
    for value, decode_error in _json_candidates(_THINK.sub("", text)):
        error = None
        if decode_error is not None:
            error = f"no valid JSON object in the output ({decode_error})"
        elif isinstance(value, dict):
            try:
                return ParseResult(model.model_validate(value))
            except RecursionError:
                error = f"output does not match the {model.__name__} schema: nested too deeply"
            except ValidationError as err:
                problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or '<root>'}: {e['msg']}"
                                     for e in err.errors()[:5])
                error = f"output does not match the {model.__name__} schema: {problems}"
        first_error = first_error or error
    return ParseResult(None, first_error or "no JSON object in the output")
