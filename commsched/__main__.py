"""`python -m commsched simulate ...` (what-if simulator) and
`python -m commsched report RUN_DIR`."""

from __future__ import annotations

import sys

USAGE = ("usage: python -m commsched {simulate,report} [options]  "
         "(--help after a command for its options)")


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if args else 2
    command, rest = args[0], args[1:]
    if command == "simulate":
        from .sim.cli import main as simulate_main
        return simulate_main(rest)
    if command == "report":
        from .reporting.command import main as report_main
        return report_main(rest)
    print(f"commsched: unknown command {command!r}\n{USAGE}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
