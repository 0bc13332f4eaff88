"""The gold teacher: a backend that answers every role from one task's gold calls.

:class:`GoldTeacher` answers from the task's gold calls (BFCL ground truth, AgentDojo
``ground_truth()``, a tasks file's expected calls), with optional fault injection so the
traces hold real failures, real Verifier FAILs and real recoveries. It is what
``heart run --model gold`` and the end-to-end evaluation's ``teacher:gold`` run, and what
``heart collect --teacher gold`` records (:mod:`heart_distill.data.teachers` builds one per
episode). It is data generation, so it lives on the data side: ``heart/`` (what runs at
inference) knows the model string ``gold`` but never builds it.

One module per role's answers (:mod:`.planner`, :mod:`.router`, :mod:`.primitive`,
:mod:`.verifier`), the faults (:mod:`.faults`), what they share (:mod:`.common`), and the
backend that follows the loop (:mod:`.teacher`).

The gold teacher writes only what a role could derive from its own input plus the gold
calls (a student can learn only what its input determines), in the formats of HEART Appendix D:

- **Planner**: plans only with tools in ``available_tools``. When a gold tool of the turn
  was not retrieved, it plans the gold calls before it (none, if the first gold tool is
  missing: the prompt's rule for "no available tool serves the request") and records the
  miss as ``retrieval_miss`` in the event's ``extra``. The Verifier then fails the plan's
  last step on ``task_completion`` and names what is still to do; the loop's re-plan adds
  tools retrieved for that feedback (``LoopConfig.replan_tools``), so the missing tool can
  come into view the way it would for any agent, never from the answer key.
- **Planner, clarifications**: in a turn whose request withholds a parameter
  (``Task.meta["withheld_turns"]``, BFCL miss_param) it answers INSUFFICIENT with one
  question (:func:`clarification_question`, from the gold calls of the turn that gives the
  value and what the user said before) until its input's clarifications hold the user's
  answer, then plans that turn's gold calls; it never asks anywhere else.
- **Router**: binds a gold value literally only when it occurs in the Router's input;
  otherwise it refers to the result of the previous plan step (``$step_j.result``), from
  which the Primitive (which sees that result) takes the value. A value that is in neither
  is bound as is and counted by the build's ``router_ungrounded`` filter.
- **Verifier**: judges each step against the gold call — FAIL when it deviates — with
  criteria per fault kind and feedback written from the Verifier's own input (step,
  argument, what the request asked, what was used). It never writes benchmark answer text.
- **Faults** (``fault_rate``): schema faults that fail binding (no side effects) and
  semantic faults that execute cleanly with a plausible wrong value taken from the same
  task's context, so the Verifier learns FAILs that execution alone does not show.
- **Natural faults** (``student``, ``student_rate``): at a Primitive step with no fault yet in
  the turn, another model (the base, or distilled roles) answers the very input instead, with
  ``student_rate``'s chance. An answer equal to the gold call is replaced by the gold answer
  (nothing to learn apart); any other answer, unparseable ones included, is executed as it is
  — a real model's real mistake, recorded as the fault ``natural`` — and the Verifier judges
  it against the gold call with the arguments the tool was really called with. These are the
  FAILs a deployed Verifier meets, beside the injected ones (the datasets' ``fault_kind``).
- **Code steps** (HEELO's Code family): where the task says a turn's answer needs a value
  computed from the gold calls' results (``Task.computations``: a total, a product, a time
  span, written from the task's request, never from its answer), the plan ends with a code
  step over the steps whose results it reads: the Router binds them as ``$step_j.result``,
  the Primitive writes the computation's expression. Only when the Code primitive is shown
  and the rest of the turn, inputs included, fits in one plan (a code step cannot read an
  earlier attempt's results); no fault is injected into it.
- **Messages** (HEELO, the Primitive's messages mode): to each step that reads this
  step's result, the field of the result where that step's gold values appear (found with
  ``deepdiff``'s search, :func:`message_for`), with a caveat when the value is one item of a
  list, occurs more than once or sits inside a longer text; to a code step, the whole result
  and what it computes. Written from the result in the input and the gold calls, never from
  the benchmark's answer.

- **Library composites** (``composites``, :mod:`heart.library`): a run of a turn's gold
  calls that a composite shown to the turn's first plan makes (same tools, argument names
  and literals) is planned, routed and called as one call of the composite (not in a turn
  with a code step, whose inputs index the gold calls).

Every answer is clipped to its role's length limits, so it validates against the schema
the role is served with (``schema_for_input`` of its own input).
"""

from heart_distill.data.gold_teacher.faults import FAULT_KINDS, NATURAL, SCHEMA_FAULTS, SEMANTIC_FAULTS
from heart_distill.data.gold_teacher.planner import clarification_question
from heart_distill.data.gold_teacher.primitive import message_for
from heart_distill.data.gold_teacher.teacher import GoldTeacher, gold_teacher_name

__all__ = ["FAULT_KINDS", "NATURAL", "SCHEMA_FAULTS", "SEMANTIC_FAULTS", "GoldTeacher", "clarification_question",
           "gold_teacher_name", "message_for"]
