"""The `mathrl` command: parses arguments and calls one library function per verb.

    mathrl train [RECIPE.yaml] [key.path=value ...] [--run-dir DIR] [--no-resume]
    mathrl VERB ...   VERB: sft, distill-data, serve-teacher, config, base, eval, inspect, report, export, push,
                      plan (each one's arguments: docs/guide.md, "The command line", or `mathrl VERB -h`)

key.path=value overrides may stand anywhere after the verb, before or after options. Errors a user
can fix (config, data, paths, models) are printed as one line each on stderr, with no traceback
(MATHRL_DEBUG=1 shows it). Exit status: 0 done, 1 error, 2 bad command line or config, 130 Ctrl-C,
143 SIGTERM (a preemption: train/preempt.py).

A new verb is one `VERBS` entry: a function in cli/arguments.py that adds its arguments to its
sub-parser, and a handler in cli/commands.py, `(ns, console) -> int`, that calls the library. This
module holds the parser, where overrides may stand, and the one place that turns errors and Ctrl-C
into messages and exit codes.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path

from rich.console import Console

import mathrl
from mathrl.cli import arguments, commands
from mathrl.cli.arguments import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_USAGE, Parser, UsageError
from mathrl.config import ConfigError

__all__ = ["VERBS", "UsageError", "build_parser", "interrupt_message", "main"]

_OVERRIDE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*=")


Verb = tuple[str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace, Console], int]]
VERBS: dict[str, Verb] = {
    "train": ("run an RL experiment (no arguments: the built-in arithmetic demo)", arguments.train, commands.train),
    "sft": ("supervised fine-tuning on (prompt, response) data; then mathrl train model.path=<run>/final", arguments.sft, commands.sft),
    "distill-data": ("sample a teacher's answers, keep those the checker accepts, write them as rows for mathrl sft",
                     arguments.distill_data, commands.distill_data),
    "serve-teacher": ("serve a distillation teacher over HTTP for teacher.url: its logprobs of given token ids",
                      arguments.serve_teacher, commands.serve_teacher),
    "config": ("list every config key with its type, default, allowed values and doc", arguments.config, commands.config),
    "base": ("build (or find in the cache) the tiny base model; prints its path", arguments.base, commands.base),
    "eval": ("evaluate checkpoints: avg@n pass@1 over seeds with 95% CIs, pass@k, maj@n, collapse rates",
             arguments.eval, commands.eval),
    "inspect": ("token-level views of what RL changed in one response: probabilities, Δlogp, entropy (HTML)",
                arguments.inspect, commands.inspect),
    "report": ("one self-contained HTML page comparing runs: curves, eval tables, config differences",
               arguments.report, commands.report),
    "export": ("write a run's final/ (or --checkpoint N) with a model card into a folder, ready to share",
               arguments.export, commands.export),
    "push": ("upload a run's model with its card to the Hugging Face Hub (the folder mathrl export writes)",
             arguments.push, commands.push),
    "plan": ("memory per device of a recipe (params, grads, optimizer, activations, KV cache, generators) and whether it fits",
             arguments.plan, commands.plan),
}
_EXTRA_POSITIONALS = {"train": "args", "sft": "args", "distill-data": "args", "config": "args",
                       "base": "args", "eval": "args", "report": "run_dirs", "plan": "args"}


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    parser = Parser(prog="mathrl", description="RL from verifiable rewards for math reasoning.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{" + ",".join(VERBS) + "}")
    verbs = {}
    for name, (help_text, add_arguments, _) in VERBS.items():
        # help strings go through %-formatting (a literal "95% CIs" broke --help); descriptions do not
        verbs[name] = sub.add_parser(name, help=help_text.replace("%", "%%"),
                                     description=help_text[0].upper() + help_text[1:] + ".")
        add_arguments(verbs[name])
    return parser, verbs


def _hoist_overrides(argv: list[str], verbs: dict[str, argparse.ArgumentParser]) -> list[str]:
    """key.path=value words (and a train/config recipe) moved to just after the verb, so that argparse
    reads them as the verb's positional words wherever they stood; an option's own value stays put."""
    at = next((i for i, a in enumerate(argv) if a in verbs), None)
    if at is None or argv[at] not in ("train", "sft", "distill-data", "config", "base", "eval", "plan"):
        return argv
    takes_value = {s for a in verbs[argv[at]]._actions if a.option_strings and a.nargs is None for s in a.option_strings}
    hoisted, kept, rest = [], [], argv[at + 1 :]
    i = 0
    while i < len(rest):
        word = rest[i]
        if word == "--":
            kept += rest[i:]
            break
        if word in takes_value:
            kept += rest[i : i + 2]
            i += 2
            continue
        recipe = argv[at] in ("train", "sft", "distill-data", "config", "plan") and word.endswith((".yaml", ".yml")) and not word.startswith("-")
        (hoisted if (_OVERRIDE.match(word) and not Path(word).exists()) or recipe else kept).append(word)
        i += 1
    return argv[: at + 1] + hoisted + kept


# ---------------------------------------------------------------------------------------------------
# errors and interrupts: one place
# ---------------------------------------------------------------------------------------------------
def _fail(kind: str, message: str, code: int) -> int:
    """`mathrl: <kind>: <message>` on stderr, one line per line of the message."""
    for line in message.splitlines() or [""]:
        print(f"mathrl: {kind}: {line}" if kind else f"mathrl: {line}", file=sys.stderr, flush=True)
    return code


def _is_known(e: BaseException) -> bool:
    """Errors raised on purpose with a message for the user: bad values, files, models, missing optional
    packages, and mathrl's own RuntimeErrors (non-finite losses, exhausted sampling, ...). Anything
    else is a bug and keeps its traceback."""
    if isinstance(e, (ValueError, OSError, ImportError)):
        return True
    return isinstance(e, RuntimeError) and type(e).__module__.startswith("mathrl.")


def interrupt_message(ns: argparse.Namespace, *, preempted: bool = False) -> str:
    """What a Ctrl-C (or, `preempted`, a SIGTERM) stopped and what was saved, in one line: the step in
    progress (the last completed one), and the step of the run directory's last complete checkpoint
    that the same command resumes from, or that nothing was saved."""
    run_dir = getattr(ns, "run_dir_used", None)
    interrupted = "stopped by SIGTERM" if preempted else "interrupted"
    if ns.command == "base":  # cache.build_once renames only a finished build into place
        return f"{interrupted}; mathrl base did not finish, nothing was cached (the next use builds the base model)"
    if ns.command not in ("train", "sft") or run_dir is None:
        return f"{interrupted}; mathrl {ns.command} did not finish"
    from mathrl.run_dir import RunDir, latest_checkpoint

    run = RunDir(run_dir)
    logged = run.last_logged_step()
    if preempted and logged:
        at = f"after step {logged}"
    elif preempted:  # SIGTERM before the first step stops where it is (train/preempt.py)
        at = "before the first step"
    else:
        at = "before the first step" if logged is None else f"at step {logged + 1}"
    interrupted = f"{interrupted} {at}"
    rerun = "rerun the same command" if ns.run_dir and not ns.no_resume else f"rerun with --run-dir {run.path}"
    checkpoint = latest_checkpoint(run.checkpoints)
    if checkpoint is not None:
        step = json.loads((checkpoint / "trainer_state.json").read_text())["step"]
        return f"{interrupted}; {rerun} to resume from step {step} ({checkpoint})"
    if run.trained_nothing():  # open_run_dir starts such a run over in place
        return f"{interrupted}; nothing was {'saved' if preempted else 'trained'}: {rerun} to start over"
    return f"{interrupted}, before the first checkpoint; rerun with --run-dir {run.path} --no-resume to start over"


def option_suggestion(words: list[str], parser: argparse.ArgumentParser) -> str:
    """`; did you mean --run-dir?` for unknown options (`--run_dir`, `--run-dri`) close to one of `parser`'s;
    "" when none is."""
    import difflib

    options = [s for a in parser._actions for s in a.option_strings if s.startswith("--")]
    found = []
    for word in words:
        name = word.split("=", 1)[0]
        if not name.startswith("--"):
            continue
        dashed = name.replace("_", "-")
        match = dashed if dashed in options else next(iter(difflib.get_close_matches(dashed, options, n=1, cutoff=0.75)), None)
        if match and match not in found:
            found.append(match)
    return f"; did you mean {' '.join(found)}?" if found else ""


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser, verbs = build_parser()
    try:
        ns, extra = parser.parse_known_args(_hoist_overrides(argv, verbs))
        dest = _EXTRA_POSITIONALS.get(ns.command)
        if extra and (dest is None or any(w.startswith("-") for w in extra)):
            verbs[ns.command].error(f"unrecognized arguments: {' '.join(extra)}{option_suggestion(extra, verbs[ns.command])}")
        if extra:
            setattr(ns, dest, list(getattr(ns, dest)) + extra)
    except SystemExit as e:  # --help / -h printed its text
        return e.code if isinstance(e.code, int) else 0
    except UsageError as e:
        return _fail("error", str(e), EXIT_USAGE)

    from mathrl.track.console import make_console

    console = make_console()
    debug = mathrl.debug()
    if not debug:  # before torch loads: its C++ warnings (vLLM's NUMA binding notice, ...) are not the user's to act on
        os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    from mathrl.train.preempt import terminate_at_once

    try:
        with terminate_at_once():  # SIGTERM stops any verb where it is; a run's steps stop between steps
            return VERBS[ns.command][2](ns, console)
    except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM (train/preempt.py's Terminated and Preempted: exit 143)
        if getattr(e, "reported_by_rank_0", False):
            return getattr(e, "exit_code", EXIT_INTERRUPTED)
        preempted = hasattr(e, "exit_code")
        return _fail("", interrupt_message(ns, preempted=preempted), getattr(e, "exit_code", EXIT_INTERRUPTED))
    except BrokenPipeError:  # `mathrl config | head`: the reader has gone; nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for a writer whose reader left
    except ConfigError as e:
        if debug:
            raise
        return _fail("config error", str(e), EXIT_USAGE)
    except Exception as e:
        if debug or not _is_known(e):
            raise
        if getattr(e, "reported_by_rank_0", False):  # a torchrun rank's copy of rank 0's error: said once, by rank 0
            return EXIT_ERROR
        return _fail("error", str(e) or type(e).__name__, EXIT_ERROR)


if __name__ == "__main__":
    sys.exit(main())
