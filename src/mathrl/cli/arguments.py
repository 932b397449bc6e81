"""The arguments of each `mathrl` verb: one function per verb adds them to its sub-parser."""

from __future__ import annotations

import argparse

EXIT_ERROR, EXIT_USAGE, EXIT_INTERRUPTED = 1, 2, 130


class UsageError(ValueError):
    """A command line that cannot be parsed; the message says what is wrong and where help is."""


class Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse prints usage + message and exits; one line is enough
        raise UsageError(f"{message} (see {self.prog} --help)")


def train(p: argparse.ArgumentParser) -> None:
    p.add_argument("args", nargs="*", help="an optional recipe .yaml, then key.path=value overrides")
    p.add_argument("--run-dir", help="where to write the run (default: runs/<timestamp>); an existing run there is resumed")
    p.add_argument("--no-resume", action="store_true",
                   help="start over even if --run-dir holds a run (the old run is moved aside, never deleted)")
    _quiet(p)
    p.add_argument("--nproc", type=int, default=1, metavar="N",
                   help="data-parallel ranks on this machine (starts torchrun; FSDP2-sharded; default 1)")


def sft(p: argparse.ArgumentParser) -> None:
    p.add_argument("args", nargs="*", help="an optional recipe .yaml, then key.path=value overrides (sft.*, data.*)")
    p.add_argument("--run-dir", help="where to write the run (default: runs/<timestamp>); an existing run there is resumed")
    p.add_argument("--no-resume", action="store_true",
                   help="start over even if --run-dir holds a run (the old run is moved aside, never deleted)")
    _quiet(p)


def _quiet(p: argparse.ArgumentParser) -> None:
    p.add_argument("-q", "--quiet", action="store_true",
                   help="leave out the start-up block (engine, threads, losses, sandbox: what the run decided); warnings stay")


def distill_data(p: argparse.ArgumentParser) -> None:
    p.add_argument("args", nargs="*", help="an optional recipe .yaml, then key.path=value overrides (data.*, rollout.*, reward.*)")
    p.add_argument("--teacher", required=True, metavar="PATH",
                   help="the model that answers: a Hugging Face model directory or hub id, a run directory (its final/), or tiny-arith")
    p.add_argument("--out", required=True, metavar="FILE.jsonl", help="the rows to write ({problem, answer, response}; "
                   "the counts go to FILE.summary.json)")
    p.add_argument("--n", type=int, default=4, help="answers sampled per prompt [4]")
    p.add_argument("--prompts", type=int, default=None,
                   help="prompts to sample [every row of data.train; 1000 problems of the arithmetic task]")
    p.add_argument("--max-per-prompt", type=int, default=1,
                   help="distinct correct answers kept per prompt [1: a prompt the teacher always solves would "
                        "otherwise weigh n times as much as one it solves once]")
    p.add_argument("--temperature", type=float, default=None, help="sampling temperature, > 0 [rollout.temperature: 1.0]")
    p.add_argument("--seed", type=int, default=None, help="seed of the problem draw and of the sampling [seed: 0]")
    p.add_argument("--force", action="store_true", help="overwrite --out if it exists")


def config(p: argparse.ArgumentParser) -> None:
    p.add_argument("args", nargs="*", help="an optional recipe .yaml, then key.path=value overrides (their values are shown)")
    p.add_argument("--yaml", action="store_true", help="print the resolved config as YAML instead of the key listing")


def base(p: argparse.ArgumentParser) -> None:
    p.add_argument("args", nargs="*", help="base.key=value overrides")


def eval(p: argparse.ArgumentParser) -> None:
    p.add_argument("args", nargs="+", metavar="TARGET|key.path=value",
                   help="model directories, run directories (every checkpoint), or tiny-arith; and config overrides")
    p.add_argument("--data", nargs="+", help="arith (arith_decimal, arith_hard), .jsonl or .parquet files, hf:<name>[:<config>][@<split>] datasets "
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


def inspect(p: argparse.ArgumentParser) -> None:
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


def plan(p: argparse.ArgumentParser) -> None:
    p.add_argument("args", nargs="*", help="a recipe .yaml, then key.path=value overrides")
    p.add_argument("--gpus", type=int, default=1,
                   help="GPUs of the machine; the training is sharded over them (FSDP) unless --trainer-gpus; "
                        "0 (or train.device=cpu): a CPU run [1]")
    p.add_argument("--gpu-mem", type=float, default=80.0, help="memory of one GPU in GiB [80]")
    p.add_argument("--trainer-gpus", type=int, default=None,
                   help="the trainer's ranks on the first N GPUs (torchrun --nproc-per-node N); generator processes "
                        "(rollout.max_staleness >= 1) take the GPUs after them [all --gpus]")
    p.add_argument("--host-mem", type=float, default=None,
                   help="host memory in GiB to check the kept policy versions (and a CPU run) against [not checked]")


def serve_teacher(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", metavar="MODEL",
                   help="the teacher: a Hugging Face model directory or hub id, a run directory (its final/), or tiny-arith")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on [127.0.0.1; 0.0.0.0 for other machines]")
    p.add_argument("--port", type=int, default=8100, help="port to listen on [8100]")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"], help="the weights' dtype [float32]")
    p.add_argument("--device", default="cpu", help="where the model runs: cpu, cuda, cuda:1 ... [cpu]")
    p.add_argument("--engine", default="torch", choices=["torch", "vllm"],
                   help="torch: the trainer's scoring pass; vllm: a vLLM engine's prompt logprobs (temperature 1 only) [torch]")
    p.add_argument("--gpu-memory-utilization", type=float, default=None,
                   help="--engine vllm on a GPU: the share of its memory vLLM takes [0.9]")
    p.add_argument("--max-topk", type=int, default=None,
                   help="--engine vllm: the largest top-k a trainer may ask (algo.distill.topk) [128]")


def report(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories written by mathrl train")
    p.add_argument("--out", default="report.html",
                   help="the HTML file to write (default: report.html); PNGs go to <stem>_plots/ beside it")
    p.add_argument("--title", default=None, help="page title (default: the run names)")
    p.add_argument("--no-png", action="store_true", help="write only the HTML (the PNGs take most of the time)")


def export(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", metavar="RUN", help="a run directory written by mathrl train or sft")
    p.add_argument("out", metavar="OUT", help="the folder to write (new or empty): the model files, README.md, mathrl_config.yaml")
    _share(p)


def push(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", metavar="RUN", help="a run directory written by mathrl train or sft")
    p.add_argument("--repo", required=True, metavar="ID", help="the Hub repository, e.g. me/tiny-arith-grpo (created if missing)")
    p.add_argument("--private", action="store_true", help="create the repository private")
    _share(p)


def _share(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", type=int, metavar="N", help="share checkpoints/step_N's weights instead of final/")
    p.add_argument("--license", help="the model card's license field, e.g. apache-2.0 (default: other, the base model's)")
