"""A reward server (`reward.functions` entry with a `url`): a small http.server on 127.0.0.1 in a
thread plays the user's server. Four cases: right scores; a slow server, timed out and counted; a
server answering 500, retried and counted; a dead server, a one-line error at the start and counted
failures when it dies mid-run. The run (a Rewarder here, a short training in the last test) never
raises for any of them.

Run: python -m pytest tests/reward/test_remote_reward.py -q
"""

from __future__ import annotations

import io
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from mathrl.config import ConfigError, load_config
from mathrl.reward.functions import build_rewarder, failure_counts
from mathrl.reward.remote import RemoteReward


class Handler(BaseHTTPRequestHandler):
    """/score: 1.0 where the gold answer is in the response, with a logged length; /slow: the same
    after 2 s; /fail: HTTP 500; /garbage: a body that is not the schema. Counts requests per path."""

    requests: dict[str, int] = {}
    bodies: list[dict] = []

    def do_POST(self):  # noqa: N802 - http.server's name
        Handler.requests[self.path] = Handler.requests.get(self.path, 0) + 1
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        Handler.bodies.append(body)
        if self.path == "/fail":
            self.send_error(500, "judge crashed")
            return
        if self.path == "/slow":
            time.sleep(2.0)
        if self.path == "/garbage":
            out = b"<html>not json</html>"
        else:
            scores = [{"score": 1.0 if f["answer"] in r else 0.0, "chars": float(len(r))}
                      for r, f in zip(body["responses"], body["fields"])]
            out = json.dumps({"scores": scores}).encode()
        try:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up on /slow
            pass

    def log_message(self, *args):  # quiet
        pass


@pytest.fixture
def server():
    Handler.requests, Handler.bodies = {}, []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def free_port() -> int:
    """A port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def reward_cfg(url: str, **kw):
    entry = {"name": "judge", "url": url, **kw}
    return load_config(None, [f"reward.functions={json.dumps([{'name': 'math', 'fn': 'math'}, entry])}",
                              "reward.num_workers=0"]).reward


ROWS = dict(prompts=["p0", "p1", "p2"], responses=[r"\boxed{4}", "five", r"\boxed{44}"],
            fields=[{"answer": "4"}, {"answer": "5"}, {"answer": "9"}], tokens=[[1], [2, 3], [4]])


def test_scores_come_back_in_order_in_batches(server):
    with build_rewarder(reward_cfg(f"{server}/score", batch_size=2, kwargs={"strict": True})) as r:
        s = r.score_rows(**ROWS)
    assert s.values["judge"] == [1.0, 0.0, 0.0]  # "9" is not in "\boxed{44}"
    assert s.logs["judge/chars"] == [9.0, 4.0, 10.0]
    assert s.total == [2.0, 0.0, 0.0]  # math + judge, weights 1
    assert Handler.requests == {"/score": 2}  # 3 samples in batches of 2
    first = Handler.bodies[0]
    assert first == {"prompts": ["p0", "p1"], "responses": [r"\boxed{4}", "five"],
                     "fields": [{"answer": "4"}, {"answer": "5"}], "tokens": [[1], [2, 3]], "kwargs": {"strict": True}}
    assert failure_counts(s)["reward/judge/errors"] == 0.0


def test_a_slow_server_times_out_and_is_counted(server):
    with build_rewarder(reward_cfg(f"{server}/slow", timeout_s=0.3, retries=1)) as r:
        s = r.score_rows(**ROWS)
    assert s.values["judge"] == [0.0, 0.0, 0.0] and s.failures["judge"] == ["timeout"] * 3
    assert failure_counts(s)["reward/judge/timeouts"] == 3.0
    assert s.total == [1.0, 0.0, 0.0]  # the math component still counts
    assert Handler.requests["/slow"] == 2  # one retry


def test_a_server_answering_500_is_retried_and_counted(server):
    with build_rewarder(reward_cfg(f"{server}/fail", retries=2)) as r:
        s = r.score_rows(**ROWS)
    assert s.failures["judge"] == ["error"] * 3 and failure_counts(s)["reward/judge/errors"] == 3.0
    assert Handler.requests["/fail"] == 3  # the first try and 2 retries


def test_an_answer_that_is_not_the_schema_is_an_error(server):
    client = RemoteReward(f"{server}/garbage", retries=0)
    out = client.score(**ROWS)
    assert out.failures == ["error"] * 3 and "not a JSON object with 'scores'" in out.details[0]


def test_a_dead_server_is_one_line_at_the_start():
    url = f"http://127.0.0.1:{free_port()}/score"
    with pytest.raises(ConfigError) as info:
        build_rewarder(reward_cfg(url))
    message = str(info.value)
    assert "\n" not in message and "reward.functions (judge)" in message and "nothing answers at 127.0.0.1" in message


def test_a_server_that_dies_mid_run_is_counted(server):
    r = build_rewarder(reward_cfg(f"{server}/score", retries=1))
    assert r.score_rows(**ROWS).values["judge"] == [1.0, 0.0, 0.0]
    # the fixture's server stops; the next call finds nothing listening
    dead = f"http://127.0.0.1:{free_port()}/score"
    r.servers["judge"].url = dead
    s = r.score_rows(**ROWS)
    assert s.failures["judge"] == ["error"] * 3 and s.total == [1.0, 0.0, 0.0]
    r.close()


def test_the_cli_says_it_in_one_line(tmp_path, capsys):
    from mathrl.cli import main

    url = f"http://127.0.0.1:{free_port()}/score"
    code = main(["train", f"reward.functions=[{{name: judge, url: '{url}'}}]", "--run-dir", str(tmp_path / "run")])
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert code != 0 and len(err) == 1 and "nothing answers at" in err[0], err


@pytest.mark.slow
def test_training_survives_a_failing_server_and_counts_it(server, tmp_path, monkeypatch):
    """Two steps of the default task with a server that answers 500: the run ends and logs the errors."""
    from rich.console import Console

    from mathrl.track.sinks import read_metrics
    from mathrl.train.loop import train

    monkeypatch.setenv("MATHRL_CACHE", str(tmp_path / "cache"))
    entries = [{"name": "math", "fn": "math"}, {"name": "judge", "url": f"{server}/fail", "weight": 0.5, "retries": 0}]
    cfg = load_config(None, [
        "base.steps=20", "base.hidden_size=32", "base.intermediate_size=64", "base.num_layers=2", "base.num_heads=2",
        "base.num_kv_heads=1", "train.steps=2", "rollout.prompts_per_step=2", "rollout.n=4", "train.mini_batch_size=8",
        "data.eval_size=4", "eval.n=1", "eval.every=2", "data.dynamic_sampling.mode=none", "reward.timeout_s=60",
        f"reward.functions={json.dumps(entries)}", f"run_dir={tmp_path / 'run'}",
    ])
    train(cfg, console=Console(file=io.StringIO()))
    rows = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if "reward/judge/errors" in r]
    assert [r["reward/judge/errors"] for r in rows] == [8.0, 8.0]  # every sample of both steps
    assert all(r["reward/judge/mean"] == 0.0 for r in rows)
    final = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if "eval/arith_heldout/reward/judge/errors" in r]
    assert final and final[-1]["eval/arith_heldout/reward/judge/errors"] == 4.0  # eval scores with the server too
