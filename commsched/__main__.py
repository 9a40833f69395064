"""``python -m commsched``: the command line, with three commands.

``simulate ...`` (the what-if simulator, docs/simulator.md), ``report RUN_DIR`` (the run
report, docs/observability.md) and ``info`` (versions, the extension's build, backends, knobs in
effect, docs/install.md).
"""

from __future__ import annotations

import sys

USAGE = ("usage: python -m commsched {simulate,report,info} [options]  "
         "(--help after a command for its options)")


def main(argv: list[str] | None = None) -> int:
    """Runs one command of `python -m commsched`.

    Args:
        argv: the arguments after ``-m commsched``; None reads sys.argv.

    Returns:
        The command's exit status (2 for an unknown command or none).
    """
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
    if command == "info":
        from .info import main as info_main
        return info_main(rest)
    print(f"commsched: unknown command {command!r}\n{USAGE}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
