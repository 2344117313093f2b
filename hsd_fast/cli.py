"""The `hsd-fast` command line."""

from __future__ import annotations

import argparse
import sys

from hsd_fast.cli_args import positive_int


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The command line's parser and its subcommands' parsers by name."""
    parser = argparse.ArgumentParser(prog="hsd-fast", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser(
        "demo", help="greedy HSD over the zoo vs the target alone (--tables: sampled exactness check)"
    )
    demo.add_argument("--prompt", help="text to continue (default: the start of a Python function)")
    demo.add_argument("--max-new-tokens", type=positive_int, default=128, help="default 128")
    demo.add_argument("--threads", type=positive_int, help="torch CPU threads")
    demo.add_argument(
        "--eager", action="store_true", help="HSD uncompiled (default: compiled first, 1-3 min on a CPU)"
    )
    demo.add_argument(
        "--adapt",
        action="store_true",
        help="let the hierarchy change while it decodes (the latency controller over every zoo draft, "
        "from the pick); the summary lists each hierarchy used",
    )
    demo.add_argument(
        "--tables", action="store_true", help="instead: sampled HSD on table models vs the exact distribution"
    )
    demo.add_argument(
        "--samples", type=positive_int, default=40_000, help="--tables: rows sampled in one batch"
    )
    demo.add_argument("--T", type=positive_int, nargs="+", default=[2, 3], help="--tables: T per draft level")
    demo.add_argument("--steps", type=positive_int, default=4, help="--tables: tokens generated per row")
    demo.add_argument("--seed", type=int, default=0, help="--tables: the sampling seed (default 0)")
    from hsd_fast.bench.command import add_parser as add_bench_parser
    from hsd_fast.doctor import add_parser as add_doctor_parser
    from hsd_fast.select_command import add_parser as add_select_parser
    from hsd_fast.zoo.commands import add_parser as add_zoo_parser

    commands = {"demo": demo, "select": add_select_parser(sub), "zoo": add_zoo_parser(sub)}
    commands |= {"bench": add_bench_parser(sub), "doctor": add_doctor_parser(sub)}
    return parser, commands


def main(argv: list[str] | None = None) -> int:
    parser, commands = build_parser()
    args = parser.parse_args(argv)
    if args.command == "doctor":
        from hsd_fast.doctor import run as run_doctor

        return run_doctor(args)
    if args.command == "bench":
        from hsd_fast.bench.command import check as check_bench
        from hsd_fast.bench.command import run as run_bench

        check_bench(args, commands["bench"])
        return run_bench(args)
    if args.command == "select":
        from hsd_fast.select_command import check as check_select
        from hsd_fast.select_command import run as run_select

        check_select(args, commands["select"])
        return run_select(args)
    if args.command == "zoo":
        from hsd_fast.zoo.commands import run as run_zoo

        return run_zoo(args, commands["zoo"])
    if args.tables:
        from hsd_fast.demo import main as tables_demo

        return tables_demo(args.samples, args.T, args.steps, args.seed)
    from hsd_fast.zoo_demo import PROMPT, check_length
    from hsd_fast.zoo_demo import main as zoo_demo

    prompt = PROMPT if args.prompt is None else args.prompt
    try:  # before any model is loaded
        check_length(prompt, args.max_new_tokens)
    except ValueError as err:
        commands["demo"].error(str(err))
    return zoo_demo(prompt, args.max_new_tokens, args.threads, compile=not args.eager, adapt=args.adapt)


if __name__ == "__main__":
    sys.exit(main())
