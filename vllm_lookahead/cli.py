"""``vllm-lookahead`` command line.  Each subcommand lives in its own module and owns its arguments;
this file only dispatches, so that ``--help`` never imports vLLM."""

from __future__ import annotations

import importlib
import sys

SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("vllm_lookahead.serve", "vLLM's `vllm serve` (works with the CPU wheel; --dtype defaults to float32)"),
    "demo": ("vllm_lookahead.demo", "generate on the demo model with and without lookahead; print tokens/s and exact match"),
    "bench": ("vllm_lookahead.bench", "benchmark none / ngram / lookahead (compression, acceptance, tokens/s, exactness)"),
    "gate": ("vllm_lookahead.gate.cli", "release gate: baseline vs candidate decoder on an eval set -> PASS/FAIL + report"),
}


def usage() -> str:
    lines = ["usage: vllm-lookahead <command> [options]", "", "commands:"]
    lines += [f"  {name:<8} {help_}" for name, (_, help_) in SUBCOMMANDS.items()]
    lines += ["", "Run `vllm-lookahead <command> --help` for a command's options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    if argv[0] in ("-V", "--version"):
        from vllm_lookahead import __version__

        print(__version__)
        return 0
    name, rest = argv[0], argv[1:]
    if name not in SUBCOMMANDS:
        print(f"vllm-lookahead: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(SUBCOMMANDS[name][0])
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
