"""The role registry: each of the four roles as one :class:`Role`, what every caller asks of it.

The loop, training, evaluation, serving and the library all ask a role the same things: its
name, its full and short system prompts, the instruction line of its user message, how to
build its messages from an input, how to parse an answer to that input, the JSON Schema the
answer is constrained to, and the prefilled start of an answer. They live in the role
modules (:mod:`heart.roles.planner`, …); this module gathers them, so no caller imports a
role module by a computed name nor decides on its own which prompt a role gets.

Some roles answer more than one kind of input, each a :class:`Mode` with its own prompts or
instruction:

- the Planner: ``plan`` (HEART D.1) and ``subgoals`` (the request's sub-goals first, then one
  step per sub-goal: :data:`heart.roles.planner.SUBGOALS_SYSTEM_PROMPT`);

- the Router: ``plan`` (the whole-plan dispatch, :data:`heart.roles.router.SYSTEM_PROMPT`)
  and ``step`` (one step, :data:`~heart.roles.router.STEP_SYSTEM_PROMPT`), one short prompt
  for both (the input says which it is);
- the Primitive: ``tool`` (resolve a request into arguments), ``relevance``
  (:mod:`heart.roles.relevance`, with its own short prompt) and ``messages``
  (:mod:`heart.roles.primitive_messages`, trained on the Primitive's own short prompt);
- the Verifier: ``step`` (one step) and ``attempt`` (a whole attempt): one prompt, two
  instructions.

Which mode an input is in follows from the input alone (:meth:`Role.mode_for`), as the role
modules' parsers and schemas already do; :meth:`Role.system_prompt` is the one place that
picks a prompt: of that mode, full or short. Nothing here changes a prompt's text or a
format: the attributes are the role modules' own objects.

    from heart.roles.registry import ROUTER, get_role
    ROUTER.system_prompt(payload, short=False)   # the full prompt of the payload's mode
    get_role("primitive").mode("relevance").system_prompt(short=True)
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable

from heart import ROLES
from heart.roles import planner, primitive, primitive_messages, relevance, router, verifier
from heart.roles.common import ParseResult

Payload = dict[str, Any]


def _always(payload: Payload) -> bool:
    return True


@dataclass(frozen=True)
class Mode:
    """One kind of input a role answers, with its own full system prompt (and the module
    whose builder, parser and schema serve it)."""

    name: str
    module: ModuleType
    """The role module that builds its messages, parses its answers and writes its schema."""
    full_system_prompt: str
    short_system_prompt: str
    """What a context-distilled adapter is trained and served on instead of the full prompt."""
    instruction: str
    """The first line of the user message (before the input's JSON block)."""
    response_prefix: str
    """The prefilled start of an answer (``LoopConfig.prefill``)."""
    accepts: Callable[[Payload], bool] = _always
    """Whether an input is of this mode (a role's last mode accepts every input)."""
    edited_by_harness: bool = True
    """Whether a harness's prompt edits of the role (:mod:`heart.harness`) apply to this
    mode: they were written for the role's main prompts, not for the Primitive's relevance
    and messages modes."""

    @property
    def output_model(self) -> type:
        """The pydantic model of an answer, without the input's checks (a teacher's target)."""
        return _OUTPUT_MODELS[self.module]

    def system_prompt(self, short: bool = False) -> str:
        return self.short_system_prompt if short else self.full_system_prompt

    def build_messages(self, payload: Payload, system_prompt: str | None = None) -> list[dict[str, str]]:
        """System + user messages for ``payload``; ``system_prompt`` None: the full prompt."""
        return self.module.build_messages(
            payload, system_prompt=self.full_system_prompt if system_prompt is None else system_prompt)

    def parse_for_input(self, text: str, payload: Payload) -> ParseResult:
        """The answer, checked against the input it answers."""
        return self.module.parse_for_input(text, payload)

    def schema_for_input(self, payload: Payload) -> dict[str, Any]:
        """The JSON Schema constrained decoding enforces for this input."""
        return self.module.schema_for_input(payload)


_OUTPUT_MODELS: dict[ModuleType, type] = {
    planner: planner.PlannerOutput, router: router.RouterOutput, primitive: primitive.PrimitiveOutput,
    relevance: relevance.RelevanceOutput, primitive_messages: primitive_messages.MessagesOutput,
    verifier: verifier.VerifierOutput}


@dataclass(frozen=True)
class Role:
    """One of the four roles: its modes, the first whose ``accepts`` takes an input serving it.
    The attributes without a payload (``full_system_prompt``, ``instruction``, …) are the
    role's main mode's (its last: the one that accepts every input)."""

    name: str
    module: ModuleType
    """The role's own module (``heart.roles.<name>``)."""
    modes: tuple[Mode, ...]

    def __post_init__(self) -> None:
        if not self.modes or self.modes[-1].accepts is not _always:
            raise ValueError(f"role {self.name}: its last mode must accept every input")

    @property
    def main(self) -> Mode:
        return self.modes[-1]

    @property
    def mode_names(self) -> tuple[str, ...]:
        return tuple(m.name for m in self.modes)

    def mode(self, name: str) -> Mode:
        for m in self.modes:
            if m.name == name:
                return m
        raise ValueError(f"role {self.name} has no mode {name!r} (its modes: {', '.join(self.mode_names)})")

    def mode_for(self, payload: Payload | None = None) -> Mode:
        """The mode ``payload`` is in (None: the main mode)."""
        if payload is None:
            return self.main
        return next(m for m in self.modes if m.accepts(payload))

    def short_system_prompt_for(self, system_prompt: str) -> str:
        """The short prompt that stands in for ``system_prompt`` (a dataset row's system
        message) in context distillation: that of the mode whose full prompt it is (the
        Primitive's relevance rows get their own), else the main mode's."""
        return next((m.short_system_prompt for m in self.modes if m.full_system_prompt == system_prompt),
                    self.short_system_prompt)

    def system_prompt(self, payload: Payload | None = None, *, short: bool = False) -> str:
        """The system prompt this role is served with for ``payload`` (None: its main mode):
        the mode's short prompt for a context-distilled adapter (``short``), else its full one."""
        return self.mode_for(payload).system_prompt(short)

    @property
    def full_system_prompt(self) -> str:
        return self.main.full_system_prompt

    @property
    def short_system_prompt(self) -> str:
        return self.main.short_system_prompt

    @property
    def instruction(self) -> str:
        return self.main.instruction

    @property
    def response_prefix(self) -> str:
        return self.main.response_prefix

    @property
    def output_model(self) -> type:
        return self.main.output_model

    def build_messages(self, payload: Payload, system_prompt: str | None = None) -> list[dict[str, str]]:
        """The messages of ``payload``'s mode; ``system_prompt`` None: that mode's full prompt."""
        return self.mode_for(payload).build_messages(payload, system_prompt)

    def parse_for_input(self, text: str, payload: Payload) -> ParseResult:
        return self.mode_for(payload).parse_for_input(text, payload)

    def schema_for_input(self, payload: Payload) -> dict[str, Any]:
        return self.mode_for(payload).schema_for_input(payload)


def _judges_an_attempt(payload: Payload) -> bool:
    """Whether a Verifier input judges a whole attempt (``LoopConfig.verify = "attempt"``),
    not one step: it then asks with :data:`heart.roles.verifier.ATTEMPT_INSTRUCTION`."""
    return len(payload.get("steps") or ()) != 1


PLANNER = Role(planner.ROLE, planner, (
    Mode("subgoals", planner, planner.SUBGOALS_SYSTEM_PROMPT, planner.SHORT_SYSTEM_PROMPT, planner.INSTRUCTION,
         planner.RESPONSE_PREFIX, accepts=planner.asks_for_subgoals),
    Mode("plan", planner, planner.SYSTEM_PROMPT, planner.SHORT_SYSTEM_PROMPT, planner.INSTRUCTION,
         planner.RESPONSE_PREFIX),
))
ROUTER = Role(router.ROLE, router, (
    Mode("step", router, router.STEP_SYSTEM_PROMPT, router.SHORT_SYSTEM_PROMPT, router.STEP_INSTRUCTION,
         router.RESPONSE_PREFIX, accepts=router.is_step_input),
    Mode("plan", router, router.SYSTEM_PROMPT, router.SHORT_SYSTEM_PROMPT, router.INSTRUCTION,
         router.RESPONSE_PREFIX),
))
PRIMITIVE = Role(primitive.ROLE, primitive, (
    Mode(primitive_messages.MODE, primitive_messages, primitive_messages.SYSTEM_PROMPT,
         primitive_messages.SHORT_SYSTEM_PROMPT, primitive_messages.INSTRUCTION, primitive_messages.RESPONSE_PREFIX,
         accepts=primitive_messages.is_messages_input, edited_by_harness=False),
    Mode(relevance.MODE, relevance, relevance.SYSTEM_PROMPT, relevance.SHORT_SYSTEM_PROMPT, relevance.INSTRUCTION,
         relevance.RESPONSE_PREFIX, accepts=relevance.is_relevance_input, edited_by_harness=False),
    Mode("tool", primitive, primitive.SYSTEM_PROMPT, primitive.SHORT_SYSTEM_PROMPT, primitive.INSTRUCTION,
         primitive.RESPONSE_PREFIX),
))
VERIFIER = Role(verifier.ROLE, verifier, (  # one prompt; the instruction says what is judged
    Mode("attempt", verifier, verifier.SYSTEM_PROMPT, verifier.SHORT_SYSTEM_PROMPT, verifier.ATTEMPT_INSTRUCTION,
         verifier.RESPONSE_PREFIX, accepts=_judges_an_attempt),
    Mode("step", verifier, verifier.SYSTEM_PROMPT, verifier.SHORT_SYSTEM_PROMPT, verifier.INSTRUCTION,
         verifier.RESPONSE_PREFIX),
))

REGISTRY: dict[str, Role] = {role.name: role for role in (PLANNER, ROUTER, PRIMITIVE, VERIFIER)}
"""Role name → :class:`Role`, in the order the loop calls them (:data:`heart.ROLES`)."""
ROLE_NAMES: tuple[str, ...] = tuple(REGISTRY)
if ROLE_NAMES != ROLES:  # heart.ROLES is the import-light list; the two must never drift apart
    raise RuntimeError(f"heart.ROLES {ROLES} and the role registry {ROLE_NAMES} disagree")


def get_role(role: str | Role | ModuleType) -> Role:
    """The :class:`Role` a name, a Role, or a role's own module (``heart.roles.router``) names."""
    if isinstance(role, Role):
        return role
    if isinstance(role, ModuleType):
        found = REGISTRY.get(getattr(role, "ROLE", None))
        if found is None or found.module is not role:
            raise ValueError(f"{role.__name__} is not a role's own module (those of {', '.join(ROLE_NAMES)})")
        return found
    if role not in REGISTRY:
        raise ValueError(f"unknown role {role!r}: expected one of {', '.join(ROLE_NAMES)}")
    return REGISTRY[role]
