"""Misusing the `delayq` command line: each mistake is refused with one clear line
(exit 2: bad input, nothing done; exit 1: the broker said no), and nothing parked or
published is lost or sent to the wrong place.

The broker is real (the integration suite's local node); `$DELAYQ_URL` points at it
in every test, so a command that silently ignored its options would act on it.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from delayq import Topology
from delayq.cli import main
from delayq.message.factory import MessageFactory
from delayq.sync import Publisher, apply_topology
from tests.amqp import depth

pytestmark = pytest.mark.integration

SECRET = "hunter2-secret"


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def delayq(capsys, monkeypatch):
    """Run ``delayq ARGV`` in this process (a subprocess costs a second of imports);
    ``env_url`` becomes ``$DELAYQ_URL``."""

    def run(*argv: str, env_url: str | None = None) -> Run:
        with monkeypatch.context() as patch:
            if env_url is not None:
                patch.setenv("DELAYQ_URL", env_url)
            capsys.readouterr()
            code = main(list(argv))  # a refused option is exit 2 too, not SystemExit
            out, err = capsys.readouterr()
        return Run(code, out, err)

    return run


def worker(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``delayq worker`` in a subprocess: it imports the handler module from ``cwd``."""
    return subprocess.run(
        [sys.executable, "-m", "delayq", "worker", *argv],
        capture_output=True,
        text=True,
        timeout=90,
        cwd=cwd,
    )


def one_error_line(run: Run | subprocess.CompletedProcess[str], code: int, *expected: str) -> str:
    """The run exited ``code`` with exactly one ``delayq: error:`` line (click adds its
    usage lines before it for a bad option), no traceback, no password."""
    assert run.returncode == code, (run.returncode, run.stdout, run.stderr)
    lines = run.stderr.splitlines()
    errors = [line for line in lines if "error:" in line]
    assert len(errors) == 1, run.stderr
    assert "Traceback" not in run.stderr
    assert SECRET not in run.stderr + run.stdout
    for text in expected:
        assert text in errors[0], (text, errors[0])
    return errors[0]


def with_password(url: str, password: str) -> str:
    scheme, rest = url.split("//", 1)
    user = rest.split(":", 1)[0]
    host = rest.rsplit("@", 1)[1]
    return f"{scheme}//{user}:{password}@{host}"


@pytest.fixture
def applied(make_topology, rabbitmq_url, tmp_path) -> tuple[Topology, Path, str]:
    """An applied topology, its YAML file, and its queue with one message in its DLQ."""
    topo = make_topology(["1s"])
    queue = f"{topo.namespace}.work"
    apply_topology(topo, rabbitmq_url)
    path = tmp_path / "topology.yaml"
    path.write_text(yaml.safe_dump(topo.model_dump(mode="json")))
    with Publisher(rabbitmq_url, topo) as pub:
        parked = MessageFactory(topo).build({"x": 1}, "job.r", "0s", message_id="keep-me")
        object.__setattr__(parked, "exchange", "")
        object.__setattr__(parked, "routing_key", f"{queue}.dlq")
        pub.send(parked)
    assert depth(rabbitmq_url, f"{queue}.dlq") == 1
    return topo, path, queue


def nothing_lost(url: str, topo: Topology, queue: str) -> None:
    assert depth(url, f"{queue}.dlq") == 1  # the parked message is still there
    assert depth(url, f"{topo.namespace}.tier.1s") == 0  # and nothing was published


@pytest.mark.parametrize(
    "argv",
    [
        ["--url", "amqp://a:{pw}@127.0.0.1:1/", "dlq", "purge", "{q}", "--yes", "--url", "{live}"],
        ["dlq", "--url", "{live}", "purge", "{q}", "--yes", "--url", "amqp://b:{pw}@x:1/"],
        ["dlq", "purge", "{q}", "--yes", "--url", "{live}", "--url", "amqp://c:{pw}@x:1/"],
        ["--file", "{file}", "dlq", "replay", "{q}", "--all", "--file", "other.yaml"],
        ["publish", "-k", "job.a", "-k", "job.b", "-d", "1s"],
        ["publish", "-k", "job.a", "-d", "1s", "--delay", "1h"],
    ],
    ids=["url-before-after", "url-between-after", "url-twice-after", "file", "key", "delay"],
)
def test_one_option_with_two_values_is_refused_and_nothing_happens(
    argv, applied, rabbitmq_url, delayq
):
    topo, path, queue = applied
    argv = [
        a.format(pw=SECRET, q=queue, live=rabbitmq_url, file=path) if "{" in a else a for a in argv
    ]
    if "--file" not in argv:
        argv += ["--file", str(path)]
    one_error_line(delayq(*argv, env_url=rabbitmq_url), 2, "different values")
    nothing_lost(rabbitmq_url, topo, queue)


def test_purge_without_yes_deletes_nothing(applied, rabbitmq_url, delayq):
    topo, path, queue = applied
    one_error_line(
        delayq("dlq", "purge", queue, "--file", str(path), env_url=rabbitmq_url), 2, "--yes"
    )
    nothing_lost(rabbitmq_url, topo, queue)


def test_replay_of_a_queue_that_is_not_in_the_topology(applied, rabbitmq_url, delayq):
    topo, path, queue = applied
    run = delayq("dlq", "replay", "orders.typo", "--all", "--file", str(path), env_url=rabbitmq_url)
    one_error_line(run, 2, "'orders.typo' is not a destination queue", queue)
    nothing_lost(rabbitmq_url, topo, queue)


@pytest.mark.parametrize(
    "content",
    [None, "namespace: [unclosed\n", "namespace: x\nladder: [5]\ndestinations: []\n", ""],
    ids=["missing", "yaml-syntax", "bare-number-ladder", "empty"],
)
@pytest.mark.parametrize(
    "command",
    [["publish", "-k", "job.x", "-d", "1s"], ["dlq", "purge", "q.work", "--yes"], ["retry-plan"]],
    ids=["publish", "purge", "retry-plan"],
)
def test_a_missing_or_invalid_topology_file(content, command, tmp_path, rabbitmq_url, delayq):
    path = tmp_path / "bad.yaml"
    if content is not None:
        path.write_text(content)
    for argv in (["--file", str(path), *command], [*command, "--file", str(path)]):
        one_error_line(delayq(*argv, env_url=rabbitmq_url), 2, "bad.yaml")


@pytest.mark.parametrize(
    "garbage",
    ["not a url", "http://broker/", f"amqp://guest:{SECRET}@host:notaport/"],
    ids=["words", "http", "bad-port"],
)
@pytest.mark.parametrize(
    "command",
    [["publish", "-k", "job.x", "-d", "1s"], ["dlq", "list", "{q}"], ["stats"]],
    ids=["publish", "dlq-list", "stats"],
)
def test_delayq_url_set_to_garbage_is_named_in_the_error(garbage, command, applied, delayq):
    _, path, queue = applied
    argv = [a.replace("{q}", queue) for a in command]
    one_error_line(delayq(*argv, "--file", str(path), env_url=garbage), 2, "$DELAYQ_URL")


BROKER_COMMANDS = {
    "apply": ["topology", "apply"],
    "verify": ["topology", "verify", "--no-management", "--no-probe"],
    "stats": ["stats", "--no-management"],
    "publish": ["publish", "-k", "job.x", "-d", "1s"],
    "dlq-list": ["dlq", "list", "{q}"],
    "dlq-show": ["dlq", "show", "{q}", "keep-me"],
    "dlq-replay": ["dlq", "replay", "{q}", "--all"],
    "dlq-purge": ["dlq", "purge", "{q}", "--yes"],
    "unrouted-list": ["unrouted", "list"],
    "unrouted-replay": ["unrouted", "replay", "--all"],
}


@pytest.mark.parametrize("before", [True, False], ids=["url-before", "url-after"])
@pytest.mark.parametrize("name", sorted(BROKER_COMMANDS))
def test_a_wrong_password_on_every_broker_command(name, before, applied, rabbitmq_url, delayq):
    topo, path, queue = applied
    wrong = with_password(rabbitmq_url, SECRET)
    command = [a.replace("{q}", queue) for a in BROKER_COMMANDS[name]]
    url = ["--url", wrong]
    argv = [*url, *command] if before else [*command, *url]
    # $DELAYQ_URL is the right broker: an ignored --url would succeed there.
    run = delayq(*argv, "--file", str(path), env_url=rabbitmq_url)
    one_error_line(run, 1, "refused the credentials", "***")
    nothing_lost(rabbitmq_url, topo, queue)


def test_a_worker_with_a_wrong_password(applied, rabbitmq_url, tmp_path):
    _, path, queue = applied
    (tmp_path / "pwapp.py").write_text(
        textwrap.dedent(f"""
        from delayq import Worker, load_topology
        worker = Worker(load_topology({str(path)!r}))

        @worker.handler({queue!r})
        def handle(value):
            pass
        """)
    )
    run = worker("pwapp", "--url", with_password(rabbitmq_url, SECRET), cwd=tmp_path)
    one_error_line(run, 1, "refused the credentials")


# Our own finds -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--url", "{live}", "topology", "plan"], "--url has no effect on `delayq topology plan`"),
        (["topology", "plan", "--url", "{live}"], "--url has no effect"),
        (["--file", "{file}", "worker", "app"], "--file has no effect on `delayq worker`"),
        (["worker", "app", "--file", "{file}"], "--file has no effect"),
        (["--url", "{live}", "retry-plan"], "--url has no effect on `delayq retry-plan`"),
        (["demo", "--file", "{file}"], "--file has no effect on `delayq demo`"),
    ],
    ids=[
        "plan-url-before",
        "plan-url-after",
        "worker-file-before",
        "worker-file-after",
        "retry-plan-url",
        "demo-file",
    ],
)
def test_an_option_the_command_does_not_use_is_refused_not_ignored(
    argv, message, applied, rabbitmq_url, delayq
):
    """The worker's module loads its own topology: `--file` there used to be ignored."""
    _, path, _ = applied
    argv = [a.replace("{live}", rabbitmq_url).replace("{file}", str(path)) for a in argv]
    one_error_line(delayq(*argv, env_url=rabbitmq_url), 2, message)


@pytest.mark.parametrize(
    "argv",
    [
        ["dlq", "list", "{q}", "--limit", "0"],
        ["dlq", "list", "{q}", "--limit", "-5"],
        ["dlq", "replay", "{q}", "--all", "--rate", "0"],
        ["dlq", "replay", "{q}", "--all", "--rate", "-1"],
        ["worker", "app", "--concurrency", "0"],
        ["worker", "app", "--prefetch", "-1"],
    ],
    ids=["limit-0", "limit-negative", "rate-0", "rate-negative", "concurrency-0", "prefetch-neg"],
)
def test_counts_and_rates_must_be_positive(argv, applied, rabbitmq_url, delayq):
    """`--limit 0` listed nothing and said the DLQ was empty; `--rate 0` meant no limit."""
    topo, path, queue = applied
    argv = [a.replace("{q}", queue) for a in argv]
    if argv[0] == "dlq":
        argv += ["--file", str(path)]
    one_error_line(delayq(*argv, env_url=rabbitmq_url), 2, "Invalid value for '--")
    nothing_lost(rabbitmq_url, topo, queue)


@pytest.mark.parametrize(
    ("source", "spec", "expected"),
    [
        ("import no_such_dependency_xyz\n", "badapp", "ModuleNotFoundError"),
        ("worker = (\n", "badapp", "SyntaxError"),
        ("raise RuntimeError('config missing')\n", "badapp", "RuntimeError: config missing"),
        ("worker = 42\n", "badapp", "is not a delayq.Worker"),
        ("", "badapp:nothere", "is not a delayq.Worker"),
    ],
    ids=["missing-dependency", "syntax-error", "raises", "not-a-worker", "missing-attr"],
)
def test_a_handler_module_that_cannot_be_loaded_exits_2(source, spec, expected, tmp_path):
    (tmp_path / "badapp.py").write_text(source)
    run = worker(spec, "--url", "amqp://guest:guest@127.0.0.1:1/", cwd=tmp_path)
    one_error_line(run, 2, expected)


def test_show_of_an_unknown_id_removes_nothing(applied, rabbitmq_url, delayq):
    topo, path, queue = applied
    run = delayq("dlq", "show", queue, "nope", "--file", str(path), env_url=rabbitmq_url)
    one_error_line(run, 1, "no message 'nope'", "1 message parked")
    nothing_lost(rabbitmq_url, topo, queue)


def test_a_topology_that_was_never_applied(make_topology, rabbitmq_url, tmp_path, delayq):
    """Partial set-up: the file names queues the broker does not have."""
    topo = make_topology(["1s"])
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(topo.model_dump(mode="json")))
    for argv in (
        ["dlq", "list", f"{topo.namespace}.work"],
        ["dlq", "purge", f"{topo.namespace}.work", "--yes"],
        ["unrouted", "list"],
    ):
        run = delayq(*argv, "--file", str(path), env_url=rabbitmq_url)
        one_error_line(run, 1, "does not exist")


def test_two_brokers_named_for_one_purge_purge_neither(applied, rabbitmq_url, delayq):
    """`--url` before and after naming two live brokers: refused, both DLQs intact."""
    topo, path, queue = applied
    other = rabbitmq_url.replace("127.0.0.1", "localhost")  # the same node, another name
    run = delayq(
        "--url", rabbitmq_url, "dlq", "purge", queue, "--yes", "--url", other, "--file", str(path)
    )
    one_error_line(run, 2, "different values")
    nothing_lost(rabbitmq_url, topo, queue)


def test_stats_with_a_management_url_that_does_not_answer_is_refused(applied, rabbitmq_url, delayq):
    """An explicit --management-url that does not answer was replaced by AMQP counts
    (ready only) under the same table: the figures asked for are refused, not swapped."""
    _, path, _ = applied
    dead_api = f"http://guest:{SECRET}@127.0.0.1:1/"
    run = delayq("stats", "--file", str(path), "--management-url", dead_api, env_url=rabbitmq_url)
    one_error_line(run, 1, "management API asked for cannot be used", "--no-management")
    assert run.stdout == ""
    # Without the option the same command counts over AMQP (or the API it finds).
    counted = delayq("stats", "--file", str(path), "--no-management", env_url=rabbitmq_url)
    assert counted.returncode == 0, counted.stderr


@pytest.mark.parametrize(
    ("delay", "says"),
    [
        ("-d=-5s", "must not be negative, got '-5s'"),
        ("-d=5s", "starts with '='"),
        ("--delay=-5s", "must not be negative, got '-5s'"),
    ],
    ids=["short-equals-negative", "short-equals", "long-negative"],
)
def test_a_delay_written_with_an_equals_sign_is_named_as_written(
    delay, says, applied, rabbitmq_url, delayq
):
    """Issue 29: click keeps the '=' of `-d=-5s`, and the error said "delay '=-5s' is not
    a duration" instead of naming the negative delay. Nothing is published."""
    topo, path, queue = applied
    run = delayq("publish", "-k", "job.a", delay, "--file", str(path), env_url=rabbitmq_url)
    one_error_line(run, 2, says)
    nothing_lost(rabbitmq_url, topo, queue)


def test_a_delayq_url_with_a_trailing_newline_works_and_errors_stay_one_line(
    applied, rabbitmq_url, delayq
):
    """Issue 29: a DELAYQ_URL read from a file kept its newline, which split the error line
    in two. A value from the environment is taken without surrounding whitespace."""
    _, path, _ = applied
    works = delayq("stats", "--no-management", "--file", str(path), env_url=f"{rabbitmq_url}\n")
    assert works.returncode == 0, works.stderr
    dead_url = "amqp://guest:guest@127.0.0.1:1/\n"
    dead = delayq("stats", "--no-management", "--file", str(path), env_url=dead_url)
    line = one_error_line(dead, 1, "cannot connect")
    assert "is RabbitMQ running" in line


def test_stats_without_the_management_api_takes_a_multi_host_url(applied, rabbitmq_url, delayq):
    """Issue 29: `stats --no-management` with a documented multi-host URL printed a
    ValueError traceback (pika read `1,h:2` as a port)."""
    _, path, queue = applied
    host = rabbitmq_url.split("@", 1)[1].split("/", 1)[0]
    many = rabbitmq_url.replace(host, f"127.0.0.1:1,{host}", 1)
    works = delayq("stats", "--no-management", "--file", str(path), "--url", many)
    assert works.returncode == 0, works.stderr
    assert queue in works.stdout and "Traceback" not in works.stderr
    dead = "amqp://guest:guest@127.0.0.1:1,127.0.0.1:2/"
    line = one_error_line(delayq("stats", "--no-management", "--file", str(path), "--url", dead), 1)
    assert "each of its 2 hosts" in line
