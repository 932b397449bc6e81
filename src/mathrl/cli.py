"""The `mathrl` command: parses arguments and calls one library function per verb.

    mathrl train [RECIPE.yaml] [key.path=value ...] [--run-dir DIR] [--no-resume]
    mathrl sft   [RECIPE.yaml] [key.path=value ...] [--run-dir DIR] [--no-resume]   supervised fine-tuning (sft.*)
    mathrl config [RECIPE.yaml] [key.path=value ...] [--yaml]   every key: type, default, allowed values, doc
    mathrl base  [base.key=value ...]                  build (or find) the tiny base model; prints its path
    mathrl eval  TARGET... [key.path=value ...] [--n 8 --seeds 0 1 2 ...]   evaluate checkpoints (docs/evaluation.md)
    mathrl inspect --base PATH --model PATH (--run DIR --step S --index I | --prompt T --response T)
                                                      token-level views of what RL changed (docs/inspect.md)
    mathrl report RUN_DIR... [--out report.html]      one HTML page comparing runs (docs/report.md)
    mathrl plan  RECIPE.yaml [key.path=value ...] --gpus N --gpu-mem 80   memory per GPU; exit 1 if it does not fit

key.path=value overrides may stand anywhere after the verb, before or after options. Errors a user
can fix (config, data, paths, models) are printed as one line each on stderr, with no traceback
(MATHRL_DEBUG=1 shows it). Exit status: 0 done, 1 error, 2 bad command line or config, 130 Ctrl-C.

A new verb is one `VERBS` entry: a function that adds its arguments to its sub-parser, and a handler
`(ns, console) -> int` that calls the library.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path

from rich.console import Console

from mathrl.config import Config, ConfigError, load_config

_OVERRIDE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*=")
EXIT_ERROR, EXIT_USAGE, EXIT_INTERRUPTED = 1, 2, 130


class UsageError(ValueError):
    """A command line that cannot be parsed; the message says what is wrong and where help is."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse prints usage + message and exits; one line is enough
        raise UsageError(f"{message} (see {self.prog} --help)")


# ---------------------------------------------------------------------------------------------------
# arguments of each verb
# ---------------------------------------------------------------------------------------------------
def _add_train(p: argparse.ArgumentParser) -> None:
    p.add_argument("args", nargs="*", help="an optional recipe .yaml, then key.path=value overrides")
    p.add_argument("--run-dir", help="where to write the run (default: runs/<timestamp>); an existing run there is resumed")
    p.add_argument("--no-resume", action="store_true",
                   help="start over even if --run-dir holds a run (the old run is moved aside, never deleted)")
    p.add_argument("--nproc", type=int, default=1, metavar="N",
                   help="data-parallel ranks on this machine (starts torchrun; FSDP2-sharded; default 1)")


def _add_sft(p: argparse.ArgumentParser) -> None:
    p.add_argument("args", nargs="*", help="an optional recipe .yaml, then key.path=value overrides (sft.*, data.*)")
    p.add_argument("--run-dir", help="where to write the run (default: runs/<timestamp>); an existing run there is resumed")
    p.add_argument("--no-resume", action="store_true",
                   help="start over even if --run-dir holds a run (the old run is moved aside, never deleted)")


def _add_config(p: argparse.ArgumentParser) -> None:
    p.add_argument("args", nargs="*", help="an optional recipe .yaml, then key.path=value overrides (their values are shown)")
    p.add_argument("--yaml", action="store_true", help="print the resolved config as YAML instead of the key listing")


def _add_base(p: argparse.ArgumentParser) -> None:
    p.add_argument("args", nargs="*", help="base.key=value overrides")


def _add_eval(p: argparse.ArgumentParser) -> None:
    p.add_argument("args", nargs="+", metavar="TARGET|key.path=value",
                   help="model directories, run directories (every checkpoint), or tiny-arith; and config overrides")
    p.add_argument("--data", nargs="+", help="arith, .jsonl or .parquet files, hf:<name>[:<config>][@<split>] datasets "
                   "(default: data.eval of the config, i.e. arith)")
    p.add_argument("--n", type=int, default=8, help="samples per problem (default 8)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="sampling seeds (default 0 1 2)")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature; 0 is greedy (with --n 1)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--max-new-tokens", type=int, help="default: eval.max_new_tokens, else rollout.max_new_tokens")
    p.add_argument("--limit", type=int, help="problems per dataset (default: all rows of a file; data.eval_size for arith)")
    p.add_argument("--template", help="prompt template (default: data.template of the config)")
    p.add_argument("--step", type=int, help="also report pass@1 averaged over this step and its neighbours")
    p.add_argument("--neighbours", type=int, help="checkpoints on each side of --step to average (default 1)")
    p.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda, cuda:1, ...")
    p.add_argument("--out", help="output directory (default: <run>/eval for one run target, else eval_<timestamp>)")


def _add_inspect(p: argparse.ArgumentParser) -> None:
    src = p.add_argument_group("the response: --prompt and --response, or a rollouts.jsonl record")
    src.add_argument("--prompt", help="prompt text (tokenized with the tokenizer's special tokens, as in training)")
    src.add_argument("--response", help="response text (tokenized without special tokens)")
    src.add_argument("--rollouts", metavar="FILE", help="a rollouts.jsonl file; the record is picked by --index (and --step)")
    src.add_argument("--run", metavar="DIR", help="a run directory: reads DIR/rollouts.jsonl, and defaults --model to "
                     "DIR/final and --base to the run's starting model (config.yaml model.path)")
    src.add_argument("--step", type=int, help="only records of this RL step count for --index")
    src.add_argument("--index", type=int, default=0, help="which record (0-based; within --step if given) [0]")
    src.add_argument("--chat-prompt", action="store_true", help="the prompt is a rendered chat template that already "
                     "holds its special tokens (automatic for runs with data.template: chat)")
    mod = p.add_argument_group("models (Hugging Face directories with the same tokenizer)")
    mod.add_argument("--base", metavar="PATH", help="the model before RL")
    mod.add_argument("--model", metavar="PATH", help="the model after RL")
    mod.add_argument("--checkpoints", metavar="PATH", nargs="+", default=[],
                     help="more checkpoints for the entropy probe, shown between base and model in the given order")
    mod.add_argument("--device", default=None, help="torch device [cuda if available, else cpu]")
    mod.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"), help="[float32]")
    view = p.add_argument_group("views")
    view.add_argument("--out", help="the HTML file to write [<run dir>/inspect.html with --run or --rollouts, "
                      "else inspect.html]")
    view.add_argument("--threshold", type=float, default=0.1, help="a token 'moved' when |p_rl - p_base| exceeds this [0.1]")
    view.add_argument("--confident", type=float, default=0.9,
                      help="over-confident: p_base >= this, p_rl > p_base and p_rl >= --saturated [0.9]")
    view.add_argument("--saturated", type=float, default=0.99, help="see --confident [0.99]")
    view.add_argument("--top-k", type=int, default=10, help="how many most-moved tokens to list [10]")
    view.add_argument("--entropy-k", type=int, default=5, help="highest-entropy positions per checkpoint [5]")
    view.add_argument("--position", type=int, default=None,
                      help="response token index for the next-token distribution [the most-moved token]")
    view.add_argument("--dist-k", type=int, default=5, help="tokens shown of that distribution [5]")


def _add_plan(p: argparse.ArgumentParser) -> None:
    p.add_argument("args", nargs="*", help="a recipe .yaml, then key.path=value overrides")
    p.add_argument("--gpus", type=int, default=1, help="GPUs the training is sharded over (FSDP) [1]")
    p.add_argument("--gpu-mem", type=float, default=80.0, help="memory of one GPU in GiB [80]")


def _add_report(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories written by mathrl train")
    p.add_argument("--out", default="report.html",
                   help="the HTML file to write (default: report.html); PNGs go to <stem>_plots/ beside it")
    p.add_argument("--title", default=None, help="page title (default: the run names)")
    p.add_argument("--no-png", action="store_true", help="write only the HTML (the PNGs take most of the time)")


# ---------------------------------------------------------------------------------------------------
# what each verb does
# ---------------------------------------------------------------------------------------------------
def _split_recipe(args: list[str]) -> tuple[str | None, list[str]]:
    recipe = None
    overrides = []
    for a in args:
        if a.endswith((".yaml", ".yml")) and "=" not in a and recipe is None:
            recipe = a
        else:
            overrides.append(a)
    return recipe, overrides


def _quiet_libraries() -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def check_writable_dir(path: Path, what: str) -> None:
    """Raise ConfigError unless `path` is a directory that can be written, or can be created as one."""
    path = Path(path).expanduser()
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{what} {str(path)!r} is a file, not a directory; choose another {what}")
    existing = path.absolute()
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise ConfigError(f"{what} {str(path)!r}: {str(existing)!r} is a file, so no directory can be made under it")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"{what} {str(path)!r}: {str(existing)!r} cannot be written (read-only or no permission); "
                          f"choose another {what}")


def check_data_files(cfg: Config) -> None:
    """Read the local data files the run will read (data.train whole, each data.eval file's first
    data.eval_size rows) before anything is built or loaded: a malformed row fails now, naming file and
    line, instead of after the model has loaded. hf: datasets are read when the run starts."""
    from mathrl.tasks.loading import load_problems
    from mathrl.tasks.sources import field_map

    for where, source in cfg._data_files():
        if where == "data.train":
            load_problems(source, field_map(cfg, source), on_error=cfg.data.on_error)
        else:
            load_problems(source, field_map(cfg, source), limit=cfg.data.eval_size, default_split="test")


def _train(ns: argparse.Namespace, console: Console) -> int:
    recipe, overrides = _split_recipe(ns.args)
    cfg = load_config(recipe, overrides)
    if ns.run_dir:
        cfg.run_dir = ns.run_dir  # a path, never re-read as YAML (--run-dir 2024-05-01 stays a string)
    cfg.run_dir = cfg.run_dir or str(Path("runs") / time.strftime("%Y%m%d-%H%M%S"))
    ns.run_dir_used = cfg.run_dir  # for the Ctrl-C message
    check_writable_dir(Path(cfg.run_dir), "--run-dir")
    check_data_files(cfg)
    if ns.nproc < 1:
        raise UsageError(f"--nproc must be >= 1, got {ns.nproc}")
    if ns.nproc > 1:  # one torchrun job; every rank runs this command without --nproc, on the same run dir
        from mathrl.train.launch import launch

        return launch(ns.nproc, [*ns.args, "--run-dir", cfg.run_dir, *(["--no-resume"] if ns.no_resume else [])])
    _quiet_libraries()
    from mathrl.train import loop

    try:
        loop.train(cfg, console=console, resume=not ns.no_resume)
    except Exception as e:
        if type(e).__name__ == "RunComplete":  # a finished run is not an error: say so and what to do
            console.print(str(e))
            return 0
        raise
    return 0


def _sft(ns: argparse.Namespace, console: Console) -> int:
    recipe, overrides = _split_recipe(ns.args)
    cfg = load_config(recipe, overrides)
    cfg.run_dir = ns.run_dir or cfg.run_dir or str(Path("runs") / time.strftime("%Y%m%d-%H%M%S"))
    ns.run_dir_used = cfg.run_dir  # for the Ctrl-C message
    check_writable_dir(Path(cfg.run_dir), "--run-dir")
    from mathrl.train.sft import check_sft_config, sft

    check_sft_config(cfg)
    check_data_files(cfg)
    _quiet_libraries()
    try:
        sft(cfg, console=console, resume=not ns.no_resume)
    except Exception as e:
        if type(e).__name__ == "RunComplete":
            console.print(str(e))
            return 0
        raise
    return 0


def _config(ns: argparse.Namespace, console: Console) -> int:
    from mathrl.config import dump_yaml
    from mathrl.config_schema import reference

    recipe, overrides = _split_recipe(ns.args)
    cfg = load_config(recipe, overrides, check_paths=False)
    if ns.yaml:
        print(dump_yaml(cfg), end="")
        return 0
    values = {e.key: e.default for e in reference(Config)}
    for e in reference(Config):
        if e.section:
            print(f"\n{e.key}:" + (f"  # {e.doc}" if e.doc else ""))
            continue
        value = cfg
        for part in e.key.split("."):
            value = getattr(value, part)
        shown = f"{value!r}" + (f" (default {values[e.key]!r})" if value != values[e.key] else "")
        allowed = f"  [{e.domain}]" if e.domain else ""
        print(f"{e.key}: {e.type} = {shown}{allowed}" + (f"  # {e.doc}" if e.doc else ""))
    return 0


def _base(ns: argparse.Namespace, console: Console) -> int:
    from mathrl.model.paths import TINY_BASE, resolve_model_path
    from mathrl.track.console import make_console

    cfg = load_config(None, ns.args)
    cfg.model.path = TINY_BASE
    _quiet_libraries()
    print(resolve_model_path(cfg, make_console(stderr=True)), flush=True)  # stdout holds only the path: $(mathrl base)
    return 0


def _eval(ns: argparse.Namespace, console: Console) -> int:
    from mathrl.evaluation.sweep import SweepSettings, TargetError, split_args, sweep

    targets, overrides = split_args(ns.args)
    if not targets:
        raise TargetError("no TARGET given: pass a model directory, a run directory or tiny-arith")
    if ns.step is None and ns.neighbours is not None:
        raise ConfigError("--neighbours needs --step (the checkpoint to average around)")
    settings = SweepSettings(
        n=ns.n, seeds=list(ns.seeds), temperature=ns.temperature, top_p=ns.top_p, max_new_tokens=ns.max_new_tokens,
        limit=ns.limit, template=ns.template, data=ns.data, device=ns.device, step=ns.step,
        neighbours=1 if ns.neighbours is None else ns.neighbours,
    )
    settings.validate()
    if ns.out:
        check_writable_dir(Path(ns.out), "--out")
    _quiet_libraries()
    sweep(targets, settings, overrides=overrides, console=console, out=Path(ns.out) if ns.out else None)
    return 0


def _inspect(ns: argparse.Namespace, console: Console) -> int:
    import dataclasses

    from mathrl.analysis.inspect_cli import InspectOptions, inspect

    _quiet_libraries()
    options = InspectOptions(**{f.name: getattr(ns, f.name) for f in dataclasses.fields(InspectOptions)})
    inspect(options, console)
    return 0


def _plan(ns: argparse.Namespace, console: Console) -> int:
    from mathrl.model.plan import estimate_memory, format_plan

    recipe, overrides = _split_recipe(ns.args)
    cfg = load_config(recipe, overrides, check_paths=False)  # planning needs the architecture, not the data
    _quiet_libraries()
    plan = estimate_memory(cfg, gpus=ns.gpus, gpu_mem_gib=ns.gpu_mem)
    print(format_plan(plan, cfg.model.path), flush=True)
    return 0 if plan.fits else EXIT_ERROR


def _report(ns: argparse.Namespace, console: Console) -> int:
    from mathrl.analysis.report import build_report

    out = build_report([Path(p) for p in ns.run_dirs], Path(ns.out), title=ns.title, pngs=not ns.no_png)
    console.print(f"wrote {out}" + ("" if ns.no_png else f" and its charts as PNGs in {out.stem}_plots/"))
    return 0


Verb = tuple[str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace, Console], int]]
VERBS: dict[str, Verb] = {
    "train": ("run an RL experiment (no arguments: the built-in arithmetic demo)", _add_train, _train),
    "sft": ("supervised fine-tuning on (prompt, response) data; then mathrl train model.path=<run>/final", _add_sft, _sft),
    "config": ("list every config key with its type, default, allowed values and doc", _add_config, _config),
    "base": ("build (or find in the cache) the tiny base model; prints its path", _add_base, _base),
    "eval": ("evaluate checkpoints: avg@n pass@1 over seeds with 95% CIs, pass@k, maj@n, collapse rates",
             _add_eval, _eval),
    "inspect": ("token-level views of what RL changed in one response: probabilities, Δlogp, entropy (HTML)",
                _add_inspect, _inspect),
    "report": ("one self-contained HTML page comparing runs: curves, eval tables, config differences",
               _add_report, _report),
    "plan": ("memory per GPU of a recipe (params, grads, optimizer, activations, KV cache) and whether it fits",
             _add_plan, _plan),
}
_EXTRA_POSITIONALS = {"train": "args", "sft": "args", "config": "args", "base": "args", "eval": "args", "report": "run_dirs", "plan": "args"}


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    parser = _Parser(prog="mathrl", description="RL from verifiable rewards for math reasoning.")
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
    if at is None or argv[at] not in ("train", "sft", "config", "base", "eval", "plan"):
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
        recipe = argv[at] in ("train", "sft", "config", "plan") and word.endswith((".yaml", ".yml")) and not word.startswith("-")
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


def _last_logged_step(run_dir: Path) -> int | None:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return None
    last = None
    for line in path.read_text(errors="replace").splitlines():
        try:
            last = int(json.loads(line)["step"])
        except (ValueError, KeyError, TypeError):
            continue  # a line cut by the interrupt
    return last


def interrupt_message(ns: argparse.Namespace) -> str:
    """What a Ctrl-C stopped and how to go on: the step in progress, and the step of the run
    directory's last complete checkpoint that the same command resumes from."""
    run_dir = getattr(ns, "run_dir_used", None)
    if ns.command not in ("train", "sft") or run_dir is None:
        return f"interrupted; mathrl {ns.command} did not finish"
    from mathrl.train.checkpoint import latest_checkpoint

    run_dir = Path(run_dir)
    logged = _last_logged_step(run_dir)
    at = "before the first step" if logged is None else f"at step {logged + 1}"
    rerun = "rerun the same command" if ns.run_dir and not ns.no_resume else f"rerun with --run-dir {run_dir}"
    checkpoint = latest_checkpoint(run_dir / "checkpoints") if run_dir.is_dir() else None
    if checkpoint is not None:
        step = json.loads((checkpoint / "trainer_state.json").read_text())["step"]
        return f"interrupted {at}; {rerun} to resume from step {step} ({checkpoint})"
    if logged is None:
        return f"interrupted {at}; nothing to resume: rerun to start over"
    return f"interrupted {at}, before the first checkpoint; rerun with --run-dir {run_dir} --no-resume to start over"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser, verbs = build_parser()
    try:
        ns, extra = parser.parse_known_args(_hoist_overrides(argv, verbs))
        dest = _EXTRA_POSITIONALS.get(ns.command)
        if extra and (dest is None or any(w.startswith("-") for w in extra)):
            verbs[ns.command].error(f"unrecognized arguments: {' '.join(extra)}")
        if extra:
            setattr(ns, dest, list(getattr(ns, dest)) + extra)
    except SystemExit as e:  # --help / -h printed its text
        return e.code if isinstance(e.code, int) else 0
    except UsageError as e:
        return _fail("error", str(e), EXIT_USAGE)

    from mathrl.track.console import make_console

    console = make_console()
    debug = os.environ.get("MATHRL_DEBUG", "") not in ("", "0")
    try:
        return VERBS[ns.command][2](ns, console)
    except KeyboardInterrupt:
        return _fail("", interrupt_message(ns), EXIT_INTERRUPTED)
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
        return _fail("error", str(e) or type(e).__name__, EXIT_ERROR)


if __name__ == "__main__":
    sys.exit(main())
