"""How a role's answer schema becomes the grammar its answer is decoded under (xgrammar).

An answer is written as ``json.dumps`` writes it with :data:`heart.roles.common.ANSWER_SEPARATORS`
— what teachers write and adapters learn — so the grammar allows exactly that spacing and no
other whitespace. xgrammar's JSON-schema grammar leaves a number's digits unbounded: a greedy
small model writing ``1.0000…`` never ends it. Here an integer part has at most
:data:`INTEGER_DIGITS` digits, a fraction :data:`FRACTION_DIGITS` and an exponent
:data:`EXPONENT_DIGITS` — room for any 64-bit integer and any float as Python's ``repr``
writes it — by rewriting those rules of xgrammar's EBNF text (where its output differs from
what the rewrite expects, the rule is left as it is). The digit bounds cost nothing per token.

Not mended: xgrammar 0.2.9 compiles a string with ``maxLength`` (every free-text field of the
roles has one) to a bounded repetition of one character class with no escape at all (upstream
mlc-ai/xgrammar#800), so a bounded string cannot hold a quote, a backslash or a newline, and
a model about to write one can only close the string. Allowing an escape inside the bounded
repetition is correct but, measured on a Router answer, made xgrammar's token mask cost
750-920 ms per token instead of 0.02 ms; the teachers' answers hold no such escape
(``bench/router_termination.py`` checks every training target).
"""

from __future__ import annotations

INTEGER_DIGITS = 20
FRACTION_DIGITS = 21
"""A float's ``repr`` has at most 17 significant digits, written with up to 4 leading zeros
after the point before Python switches to an exponent."""
EXPONENT_DIGITS = 3

_DIGITS = {  # (rule as xgrammar writes it, with bounded digits)
    'basic_number_2 ::= (("0") | ([1-9] [0-9]*))':
        f'basic_number_2 ::= (("0") | ([1-9] [0-9]{{0, {INTEGER_DIGITS - 1}}}))',
    'basic_integer ::= (("0") | (basic_integer_1 [1-9] [0-9]*))':
        f'basic_integer ::= (("0") | (basic_integer_1 [1-9] [0-9]{{0, {INTEGER_DIGITS - 1}}}))',
    'basic_number_3 ::= ("" | ("." basic_number_digits{1, -1}))':
        f'basic_number_3 ::= ("" | ("." basic_number_digits{{1, {FRACTION_DIGITS}}}))',
    'basic_number_5 ::= ("" | ([eE] basic_number_4 basic_number_digits{1, -1}))':
        f'basic_number_5 ::= ("" | ([eE] basic_number_4 basic_number_digits{{1, {EXPONENT_DIGITS}}}))',
}


def answer_ebnf(schema: str, separators: tuple[str, str]) -> str:
    """The EBNF grammar of an answer to ``schema`` written with ``separators`` and no other
    whitespace, its numbers of bounded digits."""
    import xgrammar as xgr

    ebnf = str(xgr.Grammar.from_json_schema(schema, any_whitespace=False, separators=separators))
    lines = [_DIGITS.get(line, line) for line in ebnf.split("\n")]
    return "\n".join(lines)


def compile_answer_grammar(compiler, schema: str, separators: tuple[str, str]):
    """``compiler`` (an ``xgrammar.GrammarCompiler``) compiling :func:`answer_ebnf`."""
    return compiler.compile_grammar(answer_ebnf(schema, separators))
