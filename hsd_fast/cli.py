"""The `hsd-fast` command line."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hsd-fast", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="exactness check of HSD on table models")
    demo.add_argument("--samples", type=int, default=40_000, help="rows sampled in one batch")
    demo.add_argument(
        "--T", type=int, nargs="+", default=[2, 3], help="batch size per draft level (K = count)"
    )
    demo.add_argument("--steps", type=int, default=4, help="tokens generated per row")
    demo.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.command == "demo":
        from hsd_fast.demo import main as demo_main

        return demo_main(args.samples, args.T, args.steps, args.seed)
    return 2


if __name__ == "__main__":
    sys.exit(main())
