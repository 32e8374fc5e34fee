"""The secure embedded broker, for real: SASL/SCRAM-SHA-512 over TLS, ACLs that allow
nothing by default, users and rules managed from the CLI, Redis with a password; and
kappaflow itself (the CLI, a Spark job's source and sink, counting with its transactions)
working through it without anyone typing a credential."""

from __future__ import annotations

import contextlib
import ipaddress
import json
import socket
import ssl
import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

import pytest
import redis
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient
from conftest import Result, RunCli, error_line, make_settings, run_kappaflow, start_clean_job
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from live_jobs import send_json, stop_if_running, topic_values
from service import serve
from wire import can_capture, captured

from kappaflow.kafka.broker import EmbeddedBroker
from kappaflow.kafka.records import StartAt, read_records
from kappaflow.kafka.topics import create_topic
from kappaflow.procs import free_port
from kappaflow.security import SecurityHome
from kappaflow.serving.client import redis_client
from kappaflow.serving.redis_server import EmbeddedRedis
from kappaflow.settings import Settings
from kappaflow.waiting import wait_for
from test_counting import DEFINITION, events, expected, store_counts, wait_stats
from test_iot_gateway import gateway_on, reading

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    """A state directory of its own whose broker and Redis run with security on."""
    state_dir = tmp_path_factory.mktemp("secure-state")
    settings = make_settings(state_dir, port=free_port(), controller_port=free_port(), secure=True)
    broker, store = EmbeddedBroker(settings), EmbeddedRedis(settings)
    broker.start()
    try:
        store.start()
        try:
            yield settings
        finally:
            store.stop()
    finally:
        broker.stop()


def epoch_ms(text: str) -> int:
    return int(datetime.fromisoformat(text).timestamp() * 1000)


def cli(settings: Settings, *args: str, **extra: Any) -> Result:
    return run_kappaflow(settings, *args, **extra)


def as_user(settings: Settings, user: str, password: str) -> dict[str, str]:
    """librdkafka settings of ``user`` on the secure broker."""
    return {
        **settings.kafka.client_config(),
        "sasl.username": user,
        "sasl.password": password,
        "log_level": "0",
    }


def delivery_error(config: dict[str, str], topic: str, value: bytes) -> KafkaError | None:
    """What the broker answered a produce of ``value``: None for a write it accepted."""
    outcome: list[KafkaError | None] = []
    producer = Producer({**config, "message.timeout.ms": 15_000})
    producer.produce(topic, value=value, on_delivery=lambda err, _msg: outcome.append(err))
    producer.flush(20)
    assert outcome, "no answer to the produce"
    return outcome[0]


def consume_one(config: dict[str, str], topic: str, group: str) -> bytes | KafkaError:
    """The first record of ``topic`` read in ``group``, or the error the broker gave."""
    consumer = Consumer({**config, "group.id": group, "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    try:

        def polled() -> bytes | KafkaError | None:
            message = consumer.poll(0.5)
            if message is None:
                return None
            error = message.error()
            return error if error is not None else message.value()

        found = wait_for(polled, timeout=30, what=f"a record of {topic}")
        return cast("bytes | KafkaError", found)
    finally:
        consumer.close()


def new_user(settings: Settings, name: str) -> str:
    """Add ``name`` with `kappaflow users add`; the password it printed."""
    added = cli(settings, "users", "add", name)
    assert added.code == 0, added.err
    (password,) = added.lines()
    return password


def test_a_plaintext_client_gets_nothing(secured: Settings) -> None:
    plain = AdminClient(
        {"bootstrap.servers": secured.kafka.bootstrap, "log_level": "0", "socket.timeout.ms": 3000}
    )
    with pytest.raises(Exception, match=r"transport|[Tt]imed out"):
        plain.list_topics(timeout=3)
    # The CLI told to use no security says it cannot reach the broker, and gets nothing.
    refused = cli(
        secured,
        "topics",
        "list",
        env={"KAPPAFLOW_KAFKA__SECURE": "false", "KAPPAFLOW_KAFKA__TIMEOUT_S": "3"},
    )
    error_line(refused, "KF401", 1)


def test_credentials_and_authority_are_checked(secured: Settings, tmp_path: Path) -> None:
    listed = cli(secured, "topics", "list")  # the admin's credentials, never typed
    assert listed.code == 0, listed.err
    wrong = cli(secured, "topics", "list", env={"KAPPAFLOW_KAFKA__SASL_PASSWORD": "not-it"})
    assert "not-it" not in error_line(wrong, "KF901", 1)
    unknown = cli(secured, "topics", "list", env={"KAPPAFLOW_KAFKA__SASL_USERNAME": "nobody"})
    error_line(unknown, "KF901", 1)
    # A client trusting another authority refuses the broker's certificate.
    other = SecurityHome(tmp_path / "elsewhere")
    other.ensure_tls(("127.0.0.1",))
    mistrusted = cli(
        secured, "topics", "list", env={"KAPPAFLOW_KAFKA__SSL_CA_LOCATION": str(other.ca_cert)}
    )
    error_line(mistrusted, "KF903", 1)


def test_acls_allow_nothing_until_granted(secured: Settings) -> None:
    topic = f"acl-{uuid.uuid4().hex[:8]}"
    group = f"{topic}-readers"
    create_topic(secured.kafka, topic, partitions=1)
    password = new_user(secured, "bob")
    bob = as_user(secured, "bob", password)
    users = [json.loads(line)["user"] for line in cli(secured, "users", "list", "--json").lines()]
    assert "bob" in users

    refused = delivery_error(bob, topic, b"from bob")
    assert refused is not None and refused.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    granted = cli(
        secured, "acls", "grant", "--user", "bob", "--topic", topic, "-o", "write", "-o", "describe"
    )
    assert granted.code == 0, granted.err
    assert delivery_error(bob, topic, b"from bob") is None

    # Reading the topic granted, the group not: the group is what the broker refuses.
    granted = cli(secured, "acls", "grant", "--user", "bob", "--topic", topic, "-o", "read")
    assert granted.code == 0, granted.err
    unread = consume_one(bob, topic, group)
    assert isinstance(unread, KafkaError), unread
    assert unread.code() == KafkaError.GROUP_AUTHORIZATION_FAILED, unread
    granted = cli(secured, "acls", "grant", "--user", "bob", "--group", group, "-o", "read")
    assert granted.code == 0, granted.err
    assert consume_one(bob, topic, group) == b"from bob"

    rules = [
        json.loads(line) for line in cli(secured, "acls", "list", "--user", "bob", "--json").lines()
    ]
    assert {(r["resource"], r["name"], r["operation"]) for r in rules} == {
        ("topic", topic, "write"),
        ("topic", topic, "describe"),
        ("topic", topic, "read"),
        ("group", group, "read"),
    }
    revoked = cli(secured, "acls", "revoke", "--user", "bob", "--topic", topic, "-o", "write")
    assert revoked.code == 0, revoked.err
    again = delivery_error(bob, topic, b"after the revoke")
    assert again is not None and again.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED

    # Without a rule for it, creating a topic is refused too, and said so.
    bob_env = {"KAPPAFLOW_KAFKA__SASL_USERNAME": "bob", "KAPPAFLOW_KAFKA__SASL_PASSWORD": password}
    made = cli(secured, "topics", "create", f"{topic}-bobs", env=bob_env)
    assert "bob" in error_line(made, "KF902", 1)

    assert cli(secured, "users", "remove", "bob").code == 0
    gone = cli(secured, "topics", "list", env=bob_env)
    error_line(gone, "KF901", 1)


def test_a_group_without_its_topic_is_refused_the_topic(secured: Settings) -> None:
    """The reverse of the group refusal above: the group granted, the topic not."""
    topic = f"acl-{uuid.uuid4().hex[:8]}"
    create_topic(secured.kafka, topic, partitions=1)
    user = f"grp-{uuid.uuid4().hex[:6]}"
    config = as_user(secured, user, new_user(secured, user))
    granted = cli(secured, "acls", "grant", "--user", user, "--group", f"{topic}-g", "-o", "read")
    assert granted.code == 0, granted.err
    unread = consume_one(config, topic, f"{topic}-g")
    assert isinstance(unread, KafkaError), unread
    assert unread.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, unread


def test_prefixed_rules_and_a_deny_that_wins(secured: Settings) -> None:
    """docs/security.md's example: `--topic app. --prefixed` covers every topic named so
    and no other; a deny on one of them wins over the prefix's allow."""
    run = uuid.uuid4().hex[:6]
    prefix = f"app{run}."
    inside, secret, outside = f"{prefix}x", f"{prefix}secret", f"other{run}"
    for topic in (inside, secret, outside):
        create_topic(secured.kafka, topic, partitions=1)
    user = f"pre-{run}"
    config = as_user(secured, user, new_user(secured, user))
    allow = ("--user", user, "--topic", prefix, "--prefixed", "-o", "write", "-o", "describe")
    granted = cli(secured, "acls", "grant", *allow)
    assert granted.code == 0, granted.err
    assert delivery_error(config, inside, b"inside") is None
    assert delivery_error(config, secret, b"before the deny") is None
    refused = delivery_error(config, outside, b"outside")
    assert refused is not None and refused.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED

    denied = cli(
        secured, "acls", "grant", "--user", user, "--topic", secret, "--deny", "-o", "write"
    )
    assert denied.code == 0, denied.err
    refused = delivery_error(config, secret, b"after the deny")
    assert refused is not None and refused.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert delivery_error(config, inside, b"inside, after the deny") is None
    rules = [
        json.loads(line) for line in cli(secured, "acls", "list", "--user", user, "--json").lines()
    ]
    assert {(r["name"], r["pattern"], r["operation"], r["permission"]) for r in rules} == {
        (prefix, "prefixed", "write", "allow"),
        (prefix, "prefixed", "describe", "allow"),
        (secret, "literal", "write", "deny"),
    }
    assert {r["resource"] for r in rules} == {"topic"}
    # The values each topic holds: what the broker accepted, nothing it refused.
    assert [
        m.value() for m in read_records(secured.kafka, secret, start=StartAt(beginning=True))
    ] == [b"before the deny"]
    assert [
        m.value() for m in read_records(secured.kafka, outside, start=StartAt(beginning=True))
    ] == []

    # Revoking the prefixed rule as granted leaves the user nothing on the prefix.
    revoked = cli(secured, "acls", "revoke", *allow)
    assert revoked.code == 0, revoked.err
    refused = delivery_error(config, inside, b"after the revoke")
    assert refused is not None and refused.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED


def transaction_error(
    config: dict[str, str], topic: str, transactional_id: str
) -> KafkaError | None:
    """What the broker answered a transactional producer committing one record to
    ``topic``: None when the transaction committed."""
    producer = Producer({**config, "transactional.id": transactional_id})
    try:
        producer.init_transactions(20)
        producer.begin_transaction()
        producer.produce(topic, value=transactional_id.encode())
        producer.commit_transaction(20)
    except KafkaException as exc:
        return cast("KafkaError", exc.args[0])
    return None


def test_a_transactional_producer_needs_its_transactional_id(secured: Settings) -> None:
    """docs/security.md's recipe for a transactional producer with id X: a producer's
    rules on its topic, and `write` and `describe` on transactional id X."""
    run = uuid.uuid4().hex[:6]
    topic, txn = f"txn-{run}", f"txn-{run}-producer"
    create_topic(secured.kafka, topic, partitions=1)
    user = f"txn-{run}"
    config = as_user(secured, user, new_user(secured, user))
    producer_rules = ("--user", user, "--topic", topic, "-o", "write", "-o", "describe")
    assert cli(secured, "acls", "grant", *producer_rules).code == 0
    assert delivery_error(config, topic, b"plain") is None  # a plain producer may
    refused = transaction_error(config, topic, txn)
    assert refused is not None, "a transaction without rules for its id committed"
    assert refused.code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, refused
    txn_rules = ("--user", user, "--transactional-id", txn, "-o", "write", "-o", "describe")
    granted = cli(secured, "acls", "grant", *txn_rules)
    assert granted.code == 0, granted.err
    assert transaction_error(config, topic, txn) is None
    # Another id is not covered by X's rules.
    other = transaction_error(config, topic, f"{txn}-2")
    assert other is not None and other.code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    values = [m.value() for m in read_records(secured.kafka, topic, start=StartAt(beginning=True))]
    assert values == [b"plain", txn.encode()]
    rules = [
        json.loads(line) for line in cli(secured, "acls", "list", "--user", user, "--json").lines()
    ]
    assert {(r["resource"], r["name"], r["operation"]) for r in rules} == {
        ("topic", topic, "write"),
        ("topic", topic, "describe"),
        ("transactional-id", txn, "write"),
        ("transactional-id", txn, "describe"),
    }


def test_user_and_acl_misuse(secured: Settings) -> None:
    error_line(cli(secured, "users", "remove", "nobody-here"), "KF905", 1)
    error_line(cli(secured, "users", "add", "no spaces"), "KF906", 2)
    error_line(
        cli(secured, "acls", "grant", "--user", "bob", "--topic", "t", "-o", "fly"), "KF906", 2
    )
    error_line(cli(secured, "acls", "grant", "--user", "bob", "-o", "read"), "KF906", 2)
    short = cli(secured, "users", "add", "carol", "--password-stdin", input="short\n")
    error_line(short, "KF906", 2)


def test_acls_need_a_secure_broker(cli: RunCli) -> None:
    granted = cli("acls", "grant", "--user", "bob", "--topic", "t", "-o", "read")
    error_line(granted, "KF907", 1)


def test_a_running_broker_keeps_its_mode(tmp_path: Path) -> None:
    """A new state directory started secure (its storage formatted with the credentials)
    refuses to be started again with security off while it runs."""
    settings = make_settings(tmp_path / "state", port=free_port(), controller_port=free_port())
    started = run_kappaflow(settings, "kafka", "start", "--secure")
    try:
        assert started.code == 0, started.err
        assert "SASL_SSL" in started.err
        assert run_kappaflow(settings, "topics", "list").code == 0  # secure, as last started
        error_line(run_kappaflow(settings, "kafka", "start", "--no-secure"), "KF908", 1)
    finally:
        assert run_kappaflow(settings, "kafka", "stop").code == 0


def test_unreadable_secrets_are_refused(tmp_path: Path) -> None:
    settings = make_settings(tmp_path / "state", port=free_port(), controller_port=free_port())
    home = SecurityHome(settings.state_dir)
    home.root.mkdir(parents=True)
    home.secrets_file.write_text("{not json")
    refused = run_kappaflow(settings, "topics", "list", env={"KAPPAFLOW_KAFKA__SECURE": "true"})
    assert str(home.secrets_file) in error_line(refused, "KF904", 1)


@pytest.mark.skipif(not can_capture(), reason="capturing loopback traffic needs root")
def test_no_record_value_is_readable_on_the_wire(secured: Settings, kafka: Settings) -> None:
    marker = f"wire-marker-{uuid.uuid4().hex}".encode()
    for settings in (kafka, secured):
        create_topic(settings.kafka, f"wire-{marker[-8:].decode()}", partitions=1)
    # The same produce, watched on the plaintext broker first: the sniffer does see
    # record values where they cross in clear.
    with captured(kafka.kafka.port) as clear:
        assert (
            delivery_error(kafka.kafka.client_config(), f"wire-{marker[-8:].decode()}", marker)
            is None
        )
    assert marker in clear.payload
    with captured(secured.kafka.port) as wire:
        config = {**secured.kafka.client_config(), "log_level": "0"}
        assert delivery_error(config, f"wire-{marker[-8:].decode()}", marker) is None
    assert len(wire.payload) > 1000, "nothing was captured"
    assert marker not in wire.payload
    # TLS records: a handshake (content type 22, version 3.x) opens the connection.
    assert wire.first_to_server()[:2] == b"\x16\x03"


def test_redis_wants_the_password(secured: Settings) -> None:
    with socket.create_connection((secured.redis.host, secured.redis.port), timeout=5) as raw:
        raw.sendall(b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n")
        answer = raw.recv(200)
    assert answer.startswith(b"-NOAUTH"), answer
    wrong = redis.Redis(
        host=secured.redis.host, port=secured.redis.port, username="kappaflow", password="x"
    )
    with pytest.raises(redis.AuthenticationError):
        wrong.ping()
    store = redis_client(secured)  # the settings' own credentials
    assert store.ping()


@pytest.mark.long
def test_a_spark_job_and_counting_run_through_security(secured: Settings) -> None:
    source, dest = (f"sec-{uuid.uuid4().hex[:8]}-{n}" for n in ("in", "out"))
    create_topic(secured.kafka, source, partitions=2)
    views = events(30)
    send_json(secured, source, views, key="page")
    clean, count = f"clean-{source}", f"count-{source}"
    try:
        # A Spark job's Kafka source and sink.
        started = start_clean_job(lambda *a, **k: cli(secured, *a, **k), clean, source, dest)
        assert started.code == 0, started.err
        # Counting: Spark's Kafka source, transactions to the changelog, Redis.
        counted = cli(secured, "count", "start", count, "--source", source, *DEFINITION)
        assert counted.code == 0, counted.err
        cleaned = topic_values(secured, dest, at_least=len(views), timeout=180)
        assert sorted(v["id"] for v in cleaned) == sorted(v["id"] for v in views)
        wait_stats(secured, count, counted=len(views))
        assert store_counts(secured, count) == expected(views)
        changes = topic_values(secured, f"{count}.counts", at_least=len(expected(views)))
        latest = {(c["page"], epoch_ms(c["window_start"])): c["values"]["count"] for c in changes}
        assert latest == expected(views)
    finally:
        stop_if_running(secured, clean)
        stop_if_running(secured, count)


@pytest.mark.long
def test_a_spark_job_runs_as_a_user_with_the_documented_rules(secured: Settings) -> None:
    """docs/security.md's rules for a Spark job's Kafka source and sink, and nothing
    more: the clean job, run as that user, reads its source and writes its sink."""
    run = uuid.uuid4().hex[:6]
    source, dest, job = f"ru-{run}-in", f"ru-{run}-out", f"clean-ru-{run}"
    create_topic(secured.kafka, source, partitions=2)
    create_topic(secured.kafka, dest, partitions=1)
    user = f"spark-{run}"
    password = new_user(secured, user)
    for rules in (
        ("--topic", source, "-o", "read", "-o", "describe"),
        ("--group", "spark-kafka-source", "--prefixed", "-o", "read"),
        ("--topic", dest, "-o", "write", "-o", "describe"),
    ):
        granted = cli(secured, "acls", "grant", "--user", user, *rules)
        assert granted.code == 0, granted.err
    views = events(10)
    send_json(secured, source, views, key="page")
    env = {"KAPPAFLOW_KAFKA__SASL_USERNAME": user, "KAPPAFLOW_KAFKA__SASL_PASSWORD": password}

    def as_spark_user(*args: str, **extra: Any) -> Result:
        return cli(secured, *args, env=env, **extra)

    try:
        # The clean job's dead letters go to a topic it creates: without `create` on it
        # the job fails to start, and says what the broker refused to whom.
        refused = error_line(start_clean_job(as_spark_user, job, source, dest), "KF607", 1)
        assert f"error[KF902]: Kafka refused this to {user}" in refused
        dead_letters = ("--topic", f"{job}.dlq", "-o", "create", "-o", "write", "-o", "describe")
        assert cli(secured, "acls", "grant", "--user", user, *dead_letters).code == 0
        started = start_clean_job(as_spark_user, job, source, dest)
        assert started.code == 0, started.err
        cleaned = topic_values(secured, dest, at_least=len(views), timeout=180)
        assert sorted(v["id"] for v in cleaned) == sorted(v["id"] for v in views)
    finally:
        stop_if_running(secured, job)


def test_the_gateway_and_the_service_work_through_security(secured: Settings) -> None:
    with gateway_on(secured) as gw:
        answer = gw.post("dev-1", [reading(n) for n in range(5)])
        assert answer.status_code == 200, answer.text
        assert answer.json() == {"accepted": 5, "rejected": []}
        values = topic_values(secured, gw.config.readings_topic)
    assert sorted(v["id"] for v in values) == [f"r{n}" for n in range(5)]
    with serve(secured) as service:
        assert service.get("/v1/health").json()["serving_store"] is True  # Redis, by password
        listed = {t["name"]: t for t in service.get("/v1/topics").json()["items"]}
    assert listed[gw.config.readings_topic]["records"] == 5


def test_an_expired_certificate_is_refused(tmp_path: Path) -> None:
    """A server whose certificate the trusted authority signed: expired, the handshake
    fails and the command says so (KF903), naming no credential; the same server with a
    current certificate passes the handshake (and, being no broker, is unreachable)."""
    home = SecurityHome(tmp_path / "state")
    home.ensure_tls(("127.0.0.1",))
    settings = make_settings(tmp_path / "client", bootstrap_servers="127.0.0.1:1")
    env = {
        "KAPPAFLOW_KAFKA__SECURITY_PROTOCOL": "SASL_SSL",
        "KAPPAFLOW_KAFKA__SASL_MECHANISM": "SCRAM-SHA-512",
        "KAPPAFLOW_KAFKA__SASL_USERNAME": "someone",
        "KAPPAFLOW_KAFKA__SASL_PASSWORD": "whatever-it-is",
        "KAPPAFLOW_KAFKA__SSL_CA_LOCATION": str(home.ca_cert),
        "KAPPAFLOW_KAFKA__TIMEOUT_S": "4",
    }
    now = datetime.now(UTC)
    for ends, code in ((now - timedelta(days=1), "KF903"), (now + timedelta(days=1), "KF401")):
        pem = _signed(home, tmp_path / f"{code}.pem", ends)
        with _tls_server(pem) as port:
            at = {**env, "KAPPAFLOW_KAFKA__BOOTSTRAP_SERVERS": f"127.0.0.1:{port}"}
            line = error_line(run_kappaflow(settings, "topics", "list", env=at), code, 1)
        assert "whatever-it-is" not in line


def _signed(home: SecurityHome, path: Path, ends: datetime) -> Path:
    """A key and a certificate for 127.0.0.1 that ``home``'s authority signed, valid for
    the 30 days before ``ends``, in one PEM file."""
    ca_key = serialization.load_pem_private_key(home.ca_key.read_bytes(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    ca = x509.load_pem_x509_certificate(home.ca_cert.read_bytes())
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "server")]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(ends - timedelta(days=30))
        .not_valid_after(ends)
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        + cert.public_bytes(serialization.Encoding.PEM)
    )
    return path


@contextlib.contextmanager
def _tls_server(pem: Path) -> Iterator[int]:
    """A server on a free port that completes TLS handshakes with ``pem`` and hangs up."""
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(pem)
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    done = threading.Event()

    def serve() -> None:
        while not done.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            with contextlib.suppress(OSError), server.wrap_socket(conn, server_side=True):
                pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield int(listener.getsockname()[1])
    finally:
        done.set()
        thread.join(timeout=5)
        listener.close()
