"""The BFCL categories the toolkit runs: one list, read by every command that takes
``--category`` and by both BFCL environments."""

BFCL_MULTI_TURN_CATEGORIES = ("multi_turn_base", "multi_turn_long_context", "multi_turn_miss_param")
"""BFCL categories :class:`~heart.environments.bfcl.BFCLEnvironment` runs as BFCL does.
miss_param's user withholds a parameter and gives it in the next turn; miss_func (tools
appear in a later turn) needs per-turn tool sets that the environment does not model."""

BFCL_SINGLE_TURN_CATEGORIES = {"simple": "simple_python", "multiple": "multiple", "parallel": "parallel",
                               "parallel_multiple": "parallel_multiple"}
"""BFCL single-turn AST categories :class:`~heart.environments.bfcl_ast.BFCLASTEnvironment`
runs (category name → BFCL test category, file BFCL_v4_<category>.json): ``simple`` and
``multiple`` hold one call (``multiple``: chosen among similar tools), ``parallel`` several
calls of one function, ``parallel_multiple`` several functions."""

BFCL_CATEGORIES = BFCL_MULTI_TURN_CATEGORIES + tuple(BFCL_SINGLE_TURN_CATEGORIES)
"""Every BFCL category a command takes (``--category``); multi_turn_base is the default."""
