"""``heart library``: its arguments (built without importing evaluation) and its dispatch.

    heart library propose --library runs/NAME/library --traces runs/NAME/collect
    heart library validate --library runs/NAME/library [--names NAME ...] [--limit N] [--seeds 0 1 2]
    heart library admit --library runs/NAME/library
    heart library adapter --library runs/NAME/library --role verifier --adapter DIR --data DATASETS
    heart library history --library runs/NAME/library [NAME|ROLE]
    heart library list --library runs/NAME/library

What each does: :mod:`heart_distill.eval.library`; what a library is: :mod:`heart.library`.
"""

from __future__ import annotations

from pathlib import Path

ENGINE_CHOICES = ("peft", "llamacpp", "llamacpp:f16")


def add_arguments(p) -> None:
    from heart.argtypes import nonnegative_float, positive_int
    from heart.roles.registry import ROLE_NAMES

    actions = p.add_subparsers(dest="action", required=True)
    a = actions.add_parser("propose", help="mine candidate composite primitives from verified traces")
    a.add_argument("--library", required=True, help="library folder (created when absent)")
    a.add_argument("--traces", nargs="+", required=True, help="trace files or collection folders (…/traces/*.jsonl)")
    a.add_argument("--envs", nargs="+", default=["bfcl", "agentdojo"], choices=["bfcl", "agentdojo"])
    a.add_argument("--min-support", type=positive_int, default=2, help="distinct train tasks a pattern must recur in")
    a.add_argument("--max-candidates", type=positive_int, default=8, help="per environment, most supported first")
    a.add_argument("--delta", type=nonnegative_float, default=None,
                   help="a new library's δ (points): worst-condition lift must be >= -δ (default 0)")
    a = actions.add_parser("validate", help="paired run on the gate (dev) split: library without vs with each candidate")
    a.add_argument("--library", required=True)
    a.add_argument("--names", nargs="*", help="candidates (default: every proposed or validated one)")
    a.add_argument("--split", default="dev", choices=["dev", "train"], help="gate split (never test)")
    a.add_argument("--limit", type=positive_int, help="first N tasks of the split")
    a.add_argument("--seeds", type=int, nargs="+", default=[0])
    a.add_argument("--roles", default="teacher:gold",
                   help="teacher:gold (default), base, or an adapters folder (a model plans with ToolFace)")
    a.add_argument("--engine", choices=ENGINE_CHOICES, default="llamacpp:f16")
    a.add_argument("--concurrency", type=positive_int, default=4)
    a = actions.add_parser("admit", help="admit validated candidates that pass the rule; record every decision")
    a.add_argument("--library", required=True)
    a.add_argument("--names", nargs="*")
    a = actions.add_parser("adapter", help="validate a role adapter against the incumbent on the gate split, "
                                           "then admit or reject it")
    a.add_argument("--library", required=True)
    a.add_argument("--role", required=True, choices=ROLE_NAMES)
    a.add_argument("--adapter", required=True, help="adapter folder (heart train output)")
    a.add_argument("--data", required=True, help="role datasets folder (<data>/<role>, split 'validation')")
    a.add_argument("--limit", type=positive_int, default=24, help="gate rows")
    a.add_argument("--engine", choices=ENGINE_CHOICES, default="llamacpp:f16")
    a = actions.add_parser("history", help="what was admitted or rejected, and why")
    a.add_argument("--library", required=True)
    a.add_argument("name", nargs="?", help="a role or a primitive name")
    a = actions.add_parser("list", help="admitted primitives and adapters, and candidates")
    a.add_argument("--library", required=True)


def main(args) -> int:
    from heart.library import LibraryError
    from heart.user_errors import UserError

    try:
        return run(args)
    except (LibraryError, FileNotFoundError) as err:
        raise UserError(str(err).strip('"')) from None


def run(args) -> int:
    from heart.library import load_library
    from heart_distill.eval.library import (add_candidates, admit, admit_adapter, check_adapter_base, history_lines,
                                            incumbent_with_same_weights, list_lines, load_env, mine, trace_files,
                                            validate, validate_adapter, verified_calls)

    if args.action == "propose":
        environments = {env: load_env(env) for env in args.envs}
        catalogs = {env: {s.name: s for s in e.catalog()} for env, e in environments.items()}
        calls = verified_calls(trace_files(args.traces))
        found = mine(calls, catalogs, args.min_support, args.max_candidates)
        config = None if args.delta is None else {"delta": args.delta}
        written = add_candidates(args.library, found, config)
        print(f"{len(calls)} verified train episodes; {len(found)} candidate(s), {len(written)} new in {args.library}")
        for entry in found:
            print(f"  {entry['name']} ({entry['env']}, {entry['support']['tasks']} tasks): {entry['description']}")
    elif args.action == "validate":
        validate(args.library, args.names, args.split, args.limit, tuple(args.seeds), args.roles, args.engine,
                 args.concurrency)
    elif args.action == "admit":
        for d in admit(args.library, args.names):
            print(f"{d['name']}: {d['decision'].upper()} — {d['reason']}")
    elif args.action == "adapter":
        lib_file = Path(args.library) / "library.json"
        base = load_library(args.library).base if lib_file.is_file() else {}
        check_adapter_base(args.role, args.adapter, base)  # before anything is evaluated
        same = incumbent_with_same_weights(args.library, args.role, args.adapter)
        if same is not None:
            print(f"adapter {args.role}: already admitted as v{same['version']} (same weights): nothing to validate")
            return 0
        evidence = validate_adapter(args.library, args.role, args.adapter, args.data, limit=args.limit,
                                    engine=args.engine)
        d = admit_adapter(args.library, args.role, args.adapter, evidence)
        print(f"adapter {args.role}: {d['decision'].upper()} — {d['reason']}")
    elif args.action == "history":
        print("\n".join(history_lines(args.library, args.name)))
    else:
        print("\n".join(list_lines(args.library)))
    return 0
