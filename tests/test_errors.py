"""Each error code: listed once in errors.py and docs/errors.md, and met by its condition.

A test here triggers the real condition, through the CLI in a process of its own where
that is how users meet it, and asserts the exact `error[KFnnn]` and exit status.
"""

from __future__ import annotations

import ast
import itertools
import re
import socket
import uuid
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any, cast

import click
import pytest
from conftest import REPO, Result, RunCli, error_line, executable, run_kappaflow

import kappaflow.cli
from kappaflow import errors
from kappaflow.errors import KappaflowError
from kappaflow.jobs.manager import JobManager, JobRecord, JobState
from kappaflow.procs import free_port
from kappaflow.settings import Settings, load_settings

TESTS = Path(__file__).resolve().parent

#: Codes no test triggers, and why: each needs a failure the tests cannot cause on demand.
UNTESTED = {
    "KF204": "Maven Central unreachable or a corrupt download (needs the network to fail)",
    "KF205": "javac failing or PySpark without its Hadoop jar (needs a broken install)",
    "KF307": "a process that survives SIGKILL",
    "KF850": "the kappaflow service failing inside a request (the store failing mid-request)",
    "KF613": "a part's driver started for a part the pipeline no longer has",
    "KF614": "the counting sink missing too-late events it counted (a broken changelog)",
}


def run(settings: Settings, *args: str, env: dict[str, str] | None = None) -> Result:
    return run_kappaflow(settings, *args, env=env, timeout=60)


# The catalogue.


def documented() -> dict[str, int]:
    rows = re.findall(r"^\| (KF\d{3}) \| (\d+) \|", (REPO / "docs" / "errors.md").read_text(), re.M)
    table = {code: int(status) for code, status in rows}
    assert len(table) == len(rows), "a code has two rows in docs/errors.md"
    return table


def test_docs_list_exactly_the_codes_of_errors_py() -> None:
    assert documented() == {code: cls.exit_code for code, cls in errors.catalogue().items()}


def test_codes_are_unique_and_in_their_subsystems_hundred() -> None:
    classes = [
        value
        for value in vars(errors).values()
        if isinstance(value, type) and issubclass(value, KappaflowError)
    ]
    catalogue = errors.catalogue()  # raises if two classes share a code
    assert sorted(catalogue.values(), key=lambda c: c.code) == sorted(classes, key=lambda c: c.code)
    for cls in classes:
        assert re.fullmatch(r"KF\d{3}", cls.code)
        if cls is KappaflowError:
            continue
        parent = next(b for b in cls.__mro__[1:] if issubclass(b, KappaflowError))
        if parent is not KappaflowError:
            assert cls.code[:3] == parent.code[:3], f"{cls.__name__} {cls.code} under {parent.code}"
            assert not cls.code.endswith("00")


_CODE = re.compile(r"KF\d{3}")
_IN_TEXT = re.compile(r"error\[(KF\d{3})\]")


def observed_codes(source: str) -> set[str]:
    """The codes a test module observes as a client would: the CLI's error line
    (``error_line(result, "KFnnn", …)`` or text holding ``error[KFnnn]``), a JSON answer's
    ``["code"] == "KFnnn"``, or a caught error's ``.value.code == "KFnnn"`` (or ``.code``
    of the name an ``except`` bound). A class constant compared with its own literal
    (``SomeError.code == "KFnnn"``) observes nothing. The code may be a literal, or a
    name that a ``parametrize`` table, a ``for`` over a literal table or each call of
    the helper taking it as a parameter fills with literals."""
    tree = ast.parse(source)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    caught = {n.name for n in ast.walk(tree) if isinstance(n, ast.ExceptHandler) and n.name}

    def reads_code(node: ast.expr) -> bool:
        if isinstance(node, ast.Subscript):
            return isinstance(node.slice, ast.Constant) and node.slice.value == "code"
        if not (isinstance(node, ast.Attribute) and node.attr == "code"):
            return False
        held = node.value
        return (isinstance(held, ast.Attribute) and held.attr == "value") or (
            isinstance(held, ast.Name) and held.id in caught
        )

    observed: list[ast.expr] = []
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and len(node.args) > 1:
            name = node.func.id if isinstance(node.func, ast.Name) else None
            if name == "error_line":
                observed.append(node.args[1])
        elif isinstance(node, ast.Compare) and [type(op) for op in node.ops] == [ast.Eq]:
            left, right = node.left, node.comparators[0]
            pairs = [(left, right)]
            if isinstance(left, ast.Tuple) and isinstance(right, ast.Tuple):
                pairs = list(zip(left.elts, right.elts, strict=False))
            for a, b in pairs:
                observed += [b] if reads_code(a) else [a] if reads_code(b) else []
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            found.update(_IN_TEXT.findall(node.value))
        elif isinstance(node, ast.JoinedStr):
            for before, part in itertools.pairwise(node.values):
                text = before.value if isinstance(before, ast.Constant) else None
                if (
                    isinstance(text, str)
                    and text.endswith("error[")
                    and isinstance(part, ast.FormattedValue)
                ):
                    observed.append(part.value)

    def enclosing(node: ast.AST) -> ast.FunctionDef | None:
        while node in parents:
            node = parents[node]
            if isinstance(node, ast.FunctionDef):
                return node
        return None

    def literals(node: ast.expr | None) -> set[str]:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return {node.value} if _CODE.fullmatch(node.value) else set()
        return set()

    def table(rows: ast.expr, function: ast.FunctionDef | None) -> ast.expr:
        """``rows``, or the literal a name ``rows`` was assigned in ``function``."""
        if not isinstance(rows, ast.Name) or function is None:
            return rows
        for node in ast.walk(function):
            targets = node.targets if isinstance(node, ast.Assign) else []
            if isinstance(node, ast.AnnAssign) and node.value is not None:
                targets = [node.target]
            if any(isinstance(t, ast.Name) and t.id == rows.id for t in targets):
                return cast("ast.Assign | ast.AnnAssign", node).value or rows
        return rows

    def column(rows: ast.expr, index: int, width: int) -> list[ast.expr | None]:
        """Element ``index`` of each row of a literal table of ``width`` columns."""
        if not isinstance(rows, ast.List | ast.Tuple):
            return []
        if width == 1:
            return list(rows.elts)
        return [
            row.elts[index] if isinstance(row, ast.Tuple) and len(row.elts) == width else None
            for row in rows.elts
        ]

    def resolve(expr: ast.expr | None, seen: frozenset[str] = frozenset()) -> set[str]:
        if not isinstance(expr, ast.Name):
            return literals(expr)
        function = enclosing(expr)
        name, codes = expr.id, set[str]()
        if function is None or function.name in seen:
            return codes
        seen |= {function.name}
        for loop in ast.walk(function):
            if isinstance(loop, ast.For) and isinstance(loop.target, ast.Tuple):
                targets = [t.id if isinstance(t, ast.Name) else "" for t in loop.target.elts]
                if name in targets:
                    rows = table(loop.iter, function)
                    cells = column(rows, targets.index(name), len(targets))
                    codes |= {c for cell in cells for c in literals(cell)}
        if name not in [a.arg for a in function.args.args]:
            return codes
        for decorator in function.decorator_list:
            if (
                isinstance(decorator, ast.Call)
                and isinstance(decorator.func, ast.Attribute)
                and decorator.func.attr == "parametrize"
                and len(decorator.args) == 2
            ):
                spec = decorator.args[0]
                names = (
                    [n.strip() for n in spec.value.split(",")]
                    if isinstance(spec, ast.Constant) and isinstance(spec.value, str)
                    else [e.value for e in getattr(spec, "elts", []) if isinstance(e, ast.Constant)]
                )
                if name in names:
                    cells = column(decorator.args[1], names.index(name), len(names))
                    codes |= {c for cell in cells for c in literals(cell)}
        position = [a.arg for a in function.args.args].index(name)
        for call in ast.walk(tree):
            if isinstance(call, ast.Call) and getattr(call.func, "id", None) == function.name:
                given = [k.value for k in call.keywords if k.arg == name]
                if len(call.args) > position:
                    given.append(call.args[position])
                codes |= {c for arg in given for c in resolve(arg, seen)}
        return codes

    for expr in observed:
        found |= resolve(expr)
    return found


def test_a_code_counts_only_where_a_test_observes_it() -> None:
    # error<KF966> becomes error[KF966] only at run time: this file holds no such text.
    module = """
import pytest

def helper(answer, code):
    assert answer.json()["code"] == code

@pytest.mark.parametrize(("path", "code"), [("/a", "KF961"), ("/b", "KF962")])
def test_table(path, code):
    assert (answer.status_code, answer.json()["code"]) == (404, code)

def test_various():
    error_line(run("x"), "KF963", 1)
    helper(answer, "KF964")
    with pytest.raises(Error) as caught:
        go()
    assert caught.value.code == "KF965"
    assert line.startswith("kappaflow: error<KF966>: ")
    try:
        go()
    except Error as exc:
        assert exc.code == "KF967"
    for ends, code in ((1, "KF968"), (2, "KF969")):
        assert f"error[{code}]" in line
    cases = [({"a": 1}, "KF970"), ({"b": 2}, "KF971")]
    for change, code in cases:
        with pytest.raises(Error) as raised:
            go(**change)
        assert raised.value.code == code

@pytest.mark.parametrize(("sql", "code"), [("SELEC", "KF972")])
def test_through_a_helper(sql, code):
    helper(post(sql), code)

def test_not_observed():
    assert SomeError.code == "KF981"
    assert NoChangelog.code == "KF982" and Other.code == "KF983"
    message = "KF984 appears in text"
    assert str(error) == "KF985"
""".replace("<KF966>", "[KF966]")
    assert observed_codes(module) == {f"KF{n}" for n in range(961, 973)}


def test_every_code_is_asserted_by_a_test() -> None:
    tested = {
        code for module in TESTS.glob("test_*.py") for code in observed_codes(module.read_text())
    }
    assert not tested & set(UNTESTED), "tested now: take them out of UNTESTED"
    assert set(errors.catalogue()) - set(UNTESTED) == tested


# Codes that name no condition, and timeouts, as the CLI shows them.


@pytest.mark.parametrize(
    ("cls", "code"),
    [
        (errors.KappaflowError, "KF000"),
        (errors.ConfigError, "KF100"),
        (errors.SetupError, "KF200"),
        (errors.ServiceError, "KF300"),
        (errors.KafkaClusterError, "KF400"),
        (errors.InputError, "KF500"),
        (errors.JobError, "KF600"),
        (errors.StreamError, "KF700"),
        (errors.GatewayError, "KF800"),
        (errors.SecurityError, "KF900"),
    ],
)
def test_subsystem_codes(
    cls: type[KappaflowError],
    code: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """What pipelines and tools outside kappaflow raise, without a condition of ours."""

    @click.command()
    def fails() -> None:
        raise cls("from a plugin")

    monkeypatch.setattr(kappaflow.cli, "cli", fails)
    status = kappaflow.cli.main([])
    assert capsys.readouterr().err == f"kappaflow: error[{code}]: from a plugin\n"
    assert status == cls.exit_code


@pytest.mark.parametrize(
    ("raised", "code", "message"),
    [
        (PermissionError(13, "Permission denied", "/srv/x"), "KF003", "Permission denied: /srv/x"),
        (
            click.FileError("in.json", "no such file"),
            "KF001",
            "Could not open file 'in.json': no such file",
        ),
    ],
)
def test_what_the_cli_did_not_expect_still_has_a_code(
    raised: Exception,
    code: str,
    message: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    @click.command()
    def fails() -> None:
        raise raised

    monkeypatch.setattr(kappaflow.cli, "cli", fails)
    assert kappaflow.cli.main([]) == 1
    assert capsys.readouterr().err == f"kappaflow: error[{code}]: {message}\n"


def test_a_timeout_has_a_code_and_is_still_a_timeout_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from kappaflow.waiting import wait_for

    with pytest.raises(TimeoutError) as caught:
        wait_for(lambda: None, timeout=0.2, interval=0.05, what="nothing")
    assert caught.value.code == "KF002"  # type: ignore[attr-defined]

    @click.command()
    def waits() -> None:
        wait_for(lambda: None, timeout=0.2, interval=0.05, what="nothing")

    monkeypatch.setattr(kappaflow.cli, "cli", waits)
    assert kappaflow.cli.main([]) == 1
    assert capsys.readouterr().err.startswith("kappaflow: error[KF002]: timed out after")


# Configuration and setup, without services.


def test_configuration_file(offline: Settings, tmp_path: Path) -> None:
    broken = tmp_path / "broken.toml"
    broken.write_text("[kafka\nport = 1\n")
    error_line(run(offline, "--config", str(broken), "status"), "KF102", 2)
    error_line(run(offline, "--config", str(tmp_path / "absent.toml"), "status"), "KF103", 2)


def test_java_that_cannot_say_its_version(offline: Settings, tmp_path: Path) -> None:
    executable(tmp_path / "jdk" / "bin" / "java", "exit 0")
    result = run(offline, "kafka", "start", env={"JAVA_HOME": str(tmp_path / "jdk")})
    assert "cannot read the version" in error_line(result, "KF201", 1)


def test_jars_directory_cannot_be_created(offline: Settings, tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    result = run(offline, "setup", env={"KAPPAFLOW_JARS_DIR": str(tmp_path / "a-file" / "jars")})
    assert "cannot create" in error_line(result, "KF207", 1)


def test_redis_binary_missing(offline: Settings, tmp_path: Path) -> None:
    result = run(offline, "redis", "start", env={"KAPPAFLOW_REDIS__BINARY": str(tmp_path / "no")})
    assert "does not exist" in error_line(result, "KF206", 1)


def test_mqtt_broker_missing(offline: Settings, tmp_path: Path) -> None:
    result = run(offline, "mqtt", "start", env={"KAPPAFLOW_MQTT__BINARY": str(tmp_path / "no")})
    assert "does not exist" in error_line(result, "KF208", 1)


# The embedded services.


def test_port_in_use(offline: Settings) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = str(holder.getsockname()[1])
        result = run(offline, "redis", "start", env={"KAPPAFLOW_REDIS__PORT": port})
    assert "already in use" in error_line(result, "KF301", 1)


def test_service_exits_during_start_up(offline: Settings, tmp_path: Path) -> None:
    binary = executable(tmp_path / "redis-server", "echo 'no such config'; exit 1")
    result = run(offline, "redis", "start", env={"KAPPAFLOW_REDIS__BINARY": str(binary)})
    assert "Redis exited during start-up" in error_line(result, "KF303", 1)


def test_service_does_not_answer_in_time(tmp_path: Path) -> None:
    from kappaflow.serving.redis_server import EmbeddedRedis

    binary = executable(tmp_path / "redis-server", "exec sleep 60")
    settings = load_settings(
        state_dir=tmp_path / "state", redis={"port": free_port(), "binary": binary}
    )
    with pytest.raises(errors.ServiceStartTimeoutError, match="did not answer") as caught:
        EmbeddedRedis(settings).start(timeout=1.0)
    assert caught.value.code == "KF304" and isinstance(caught.value, TimeoutError)


def test_external_services_are_not_managed(offline: Settings) -> None:
    external = {"KAPPAFLOW_KAFKA__BOOTSTRAP_SERVERS": f"127.0.0.1:{free_port()}"}
    assert "external" in error_line(run(offline, "kafka", "stop", env=external), "KF305", 1)
    redis_url = {"KAPPAFLOW_REDIS__URL": f"redis://127.0.0.1:{free_port()}/0"}
    assert "external" in error_line(run(offline, "redis", "stop", env=redis_url), "KF305", 1)


def test_redis_unreachable(offline: Settings) -> None:
    result = run(
        offline,
        "count",
        "start",
        "c1",
        "--source",
        "s",
        "--key",
        "k",
        "--time",
        "ts",
        "--window",
        "1m",
    )
    assert "cannot reach Redis" in error_line(result, "KF306", 1)


# Input, without services.


def test_count_definitions(offline: Settings) -> None:
    def count(*options: str) -> Result:
        return run(offline, "count", "start", "c1", "--source", "s", "--time", "ts", *options)

    error_line(count("--key", "k", "--window", "5x"), "KF501", 1)
    error_line(count("--key", "not a field", "--window", "1m"), "KF507", 1)
    error_line(count("--key", "k", "--window", "1m", "--session-gap", "1m"), "KF508", 1)
    error_line(count("--key", "k", "--window", "0s"), "KF509", 1)


def test_times_and_ranges(offline: Settings) -> None:
    from kappaflow.kafka.topics import create_topic
    from kappaflow.timeutil import parse_time, to_epoch_ms

    with pytest.raises(errors.InvalidTimeError) as caught:
        parse_time("yesterday")
    assert caught.value.code == "KF502"
    with pytest.raises(errors.InvalidTimeError):
        to_epoch_ms(datetime(2026, 11, 21))  # noqa: DTZ001 (a naive time is the condition)
    with pytest.raises(errors.OutOfRangeError) as out_of_range:
        create_topic(offline.kafka, "t", partitions=0)
    assert out_of_range.value.code == "KF504"


def test_pairs_and_replay(offline: Settings) -> None:
    result = run(offline, "jobs", "start", "j1", "--pipeline", "clean", "-P", "source")
    assert "KEY=VALUE" in error_line(result, "KF503", 1)
    error_line(run(offline, "replay", "t1", "t1", "--since", "1h"), "KF506", 1)


# Jobs, without services.


def test_pipeline_references(offline: Settings) -> None:
    def start(reference: str) -> Result:
        return run(offline, "jobs", "start", "j1", "--pipeline", reference)

    error_line(start("nope"), "KF603", 1)
    error_line(start("kappaflow.no_such_module:PIPELINE"), "KF603", 1)
    error_line(start("kappaflow.errors:catalogue"), "KF604", 1)
    error_line(start("not a reference:x"), "KF604", 1)


def test_missing_parameter(offline: Settings) -> None:
    from kappaflow.jobs.contract import JobContext

    ctx = JobContext("j1", {}, spark=cast(Any, None), settings=offline)
    with pytest.raises(errors.MissingParameterError, match="needs the parameter 'source'") as c:
        ctx.param("source")
    assert c.value.code == "KF609"


def test_job_directory_cannot_be_created(offline: Settings, tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    env = {"KAPPAFLOW_STATE_DIR": str(tmp_path / "a-file" / "state")}
    result = run(offline, "jobs", "start", "j1", "--pipeline", "clean", env=env)
    assert "cannot create" in error_line(result, "KF610", 1)


def test_no_committed_state(offline: Settings) -> None:
    from kappaflow.counting.spec import CountSpec
    from kappaflow.counting.state import read_state

    spec = CountSpec(source="s", key_field="k", time_field="ts", window_ms=60_000)
    home = JobManager(offline).job_dir("c1")
    home.mkdir(parents=True)
    JobRecord(name="c1", pipeline="count", params=spec.to_params()).save(home / "job.json")
    with pytest.raises(errors.NoCommittedStateError, match="no committed state") as caught:
        read_state(offline, "c1")
    assert caught.value.code == "KF612"


# With Kafka.


def test_topics(cli: RunCli, new_topic: Callable[..., str], topic_name: str) -> None:
    topic = new_topic()
    assert "already exists" in error_line(cli("topics", "create", topic), "KF402", 1)
    unknown = cli("topics", "create", topic_name, "-c", "no.such.config=1")
    error_line(unknown, "KF403", 1)
    error_line(cli("topics", "describe", topic_name), "KF404", 1)
    error_line(cli("consume", topic, "--from-beginning", "-p", "3"), "KF505", 1)


def test_produce_rejected_by_the_broker(cli: RunCli, topic_name: str) -> None:
    assert cli("topics", "create", topic_name, "-c", "max.message.bytes=1000").code == 0
    big = '{"pad": "' + "x" * 5000 + '"}\n'
    assert "sending to" in error_line(cli("produce", topic_name, input=big), "KF405", 1)


def test_job_lifecycle_errors(
    cli: RunCli, kafka: Settings, new_topic: Callable[..., str], topic_name: str
) -> None:
    """A driver is started only where the condition needs one: the bad trigger fails in
    the driver, so `jobs start` waits for it; the second start needs a driver running."""
    source, dest = new_topic(), f"{topic_name}-out"
    job = f"err-{uuid.uuid4().hex[:8]}"
    params = ("-P", f"source={source}", "-P", f"dest={dest}", "-P", "trigger=often")
    start = ("jobs", "start", job, "--pipeline", "clean", *params)
    failed = error_line(cli(*start), "KF607", 1)
    assert "error[KF616]: invalid trigger 'often'" in failed  # the driver's own code
    assert JobManager(kafka).get(job).state is JobState.FAILED
    assert "not running" in error_line(cli("jobs", "stop", job), "KF606", 1)
    assert "not a counting job" in error_line(cli("count", "status", job), "KF611", 1)

    assert cli(*start, "--no-wait").code == 0
    try:
        assert "already running" in error_line(cli(*start, "--no-wait"), "KF605", 1)
    finally:
        JobManager(kafka).stop(job, timeout=5)


def test_job_start_timeout(kafka: Settings, new_topic: Callable[..., str], topic_name: str) -> None:
    jobs = JobManager(kafka)
    params = {"source": new_topic(), "dest": f"{topic_name}-out"}
    with pytest.raises(errors.JobStartTimeoutError) as caught:
        jobs.start(f"slow-{topic_name}", "clean", params, timeout=1.0)
    assert caught.value.code == "KF608" and isinstance(caught.value, TimeoutError)
