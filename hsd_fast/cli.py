"""The `hsd-fast` command line."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hsd-fast", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser(
        "demo", help="greedy HSD over the zoo vs the target alone (--tables: sampled exactness check)"
    )
    demo.add_argument("--prompt", help="text to continue (default: the start of a Python function)")
    demo.add_argument("--max-new-tokens", type=int, default=128)
    demo.add_argument("--threads", type=int, help="torch CPU threads")
    demo.add_argument(
        "--tables", action="store_true", help="instead: sampled HSD on table models vs the exact distribution"
    )
    demo.add_argument("--samples", type=int, default=40_000, help="--tables: rows sampled in one batch")
    demo.add_argument("--T", type=int, nargs="+", default=[2, 3], help="--tables: T per draft level")
    demo.add_argument("--steps", type=int, default=4, help="--tables: tokens generated per row")
    demo.add_argument("--seed", type=int, default=0)
    from hsd_fast.select_command import add_parser as add_select_parser
    from hsd_fast.zoo.commands import add_parser as add_zoo_parser

    add_select_parser(sub)
    add_zoo_parser(sub)
    args = parser.parse_args(argv)
    if args.command == "select":
        from hsd_fast.select_command import run as run_select

        return run_select(args)
    if args.command == "zoo":
        from hsd_fast.zoo.commands import run as run_zoo

        return run_zoo(args)
    if args.tables:
        from hsd_fast.demo import main as tables_demo

        return tables_demo(args.samples, args.T, args.steps, args.seed)
    from hsd_fast.zoo_demo import PROMPT
    from hsd_fast.zoo_demo import main as zoo_demo

    return zoo_demo(args.prompt or PROMPT, args.max_new_tokens, args.threads)


if __name__ == "__main__":
    sys.exit(main())
