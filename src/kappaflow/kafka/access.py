"""Who may do what on the broker: SCRAM users and access control lists.

Users authenticate with SCRAM-SHA-512; what they may do is what an ACL allows them (the
secure embedded broker allows nothing by default). Both go through the Admin API, so they
work on any cluster kappaflow can reach as a user allowed to alter them.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialAlteration,
    UserScramCredentialDeletion,
    UserScramCredentialUpsertion,
)

from kappaflow.errors import (
    InvalidAclError,
    SecurityUnavailableError,
    UnknownKafkaUserError,
)
from kappaflow.kafka.clients import admin, cluster_metadata, kafka_error
from kappaflow.security import SCRAM_ITERATIONS
from kappaflow.settings import KafkaSettings

#: What a rule may name, as the CLI spells it.
RESOURCES: Final = {
    "topic": ResourceType.TOPIC,
    "group": ResourceType.GROUP,
    "cluster": ResourceType.BROKER,  # librdkafka's name for Kafka's CLUSTER resource
    "transactional-id": ResourceType.TRANSACTIONAL_ID,
}
OPERATIONS: Final = {
    op.name.lower().replace("_", "-"): op
    for op in AclOperation
    if op not in (AclOperation.UNKNOWN, AclOperation.ANY)
}
#: Kafka's name for the one cluster resource.
CLUSTER_NAME: Final = "kafka-cluster"


def check_operation(op: str) -> str:
    """``op`` if it names an operation (KF906 if not)."""
    if op not in OPERATIONS:
        raise InvalidAclError(
            f"unknown operation {op!r}: use one of {', '.join(sorted(OPERATIONS))}"
        )
    return op


_USER = re.compile(r"[A-Za-z0-9._-]{1,64}")


@dataclass(frozen=True)
class User:
    name: str
    mechanisms: tuple[str, ...]

    def as_dict(self) -> dict[str, Any]:
        return {"user": self.name, "mechanisms": list(self.mechanisms)}


@dataclass(frozen=True)
class Rule:
    """One access control entry: ``user`` may (or, denied, may not) do ``operation`` on
    the ``resource`` named ``name`` (a prefix of names when ``prefixed``)."""

    user: str
    resource: str
    name: str
    operation: str
    prefixed: bool = False
    allow: bool = True
    host: str = "*"

    def _fields(self) -> tuple[Any, ...]:
        return (
            RESOURCES[self.resource],
            self.name,
            ResourcePatternType.PREFIXED if self.prefixed else ResourcePatternType.LITERAL,
            f"User:{self.user}",
            self.host,
            OPERATIONS[self.operation],
            AclPermissionType.ALLOW if self.allow else AclPermissionType.DENY,
        )

    def binding(self) -> AclBinding:
        return AclBinding(*self._fields())

    def matcher(self) -> AclBindingFilter:
        return AclBindingFilter(*self._fields())

    @classmethod
    def from_binding(cls, binding: AclBinding) -> Rule:
        kinds: dict[Any, str] = {v: k for k, v in RESOURCES.items()}
        resource = kinds.get(binding.restype, "?")
        operation = str(getattr(binding.operation, "name", binding.operation))
        operation = operation.lower().replace("_", "-")
        return cls(
            user=binding.principal.removeprefix("User:"),
            resource=resource,
            name=binding.name,
            operation=operation,
            prefixed=binding.resource_pattern_type is ResourcePatternType.PREFIXED,
            allow=binding.permission_type is AclPermissionType.ALLOW,
            host=binding.host,
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "user": self.user,
            "resource": self.resource,
            "name": self.name,
            "pattern": "prefixed" if self.prefixed else "literal",
            "operation": self.operation,
            "permission": "allow" if self.allow else "deny",
            "host": self.host,
        }


def rules(
    user: str,
    *,
    topics: Iterable[str] = (),
    groups: Iterable[str] = (),
    transactional_ids: Iterable[str] = (),
    cluster: bool = False,
    operations: Iterable[str],
    prefixed: bool = False,
    allow: bool = True,
) -> list[Rule]:
    """Every (resource, operation) pair the options name, checked."""
    check_user(user)
    ops = list(operations)
    if not ops:
        raise InvalidAclError("name at least one --operation")
    for op in ops:
        check_operation(op)
    named: list[tuple[str, str]] = [("topic", t) for t in topics]
    named += [("group", g) for g in groups]
    named += [("transactional-id", t) for t in transactional_ids]
    if cluster:
        named.append(("cluster", CLUSTER_NAME))
    if not named:
        raise InvalidAclError("name a resource: --topic, --group, --transactional-id or --cluster")
    for kind, name in named:
        if not name:
            raise InvalidAclError(f"a {kind} name cannot be empty")
    return [
        Rule(user, kind, name, op, prefixed=prefixed and kind != "cluster", allow=allow)
        for kind, name in named
        for op in ops
    ]


def check_user(name: str) -> str:
    if not _USER.fullmatch(name):
        raise InvalidAclError(
            f"invalid user name {name!r}: 1 to 64 letters, digits, '.', '_' or '-'"
        )
    return name


def new_password() -> str:
    return secrets.token_urlsafe(24)


def upsert_users(kafka: KafkaSettings, users: Mapping[str, str]) -> None:
    """Create the users, or give them new passwords (SCRAM-SHA-512)."""
    changes: list[UserScramCredentialAlteration] = [
        UserScramCredentialUpsertion(
            check_user(name),
            ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, SCRAM_ITERATIONS),
            password.encode(),
        )
        for name, password in users.items()
    ]
    if not changes:
        return
    client = _admin(kafka)
    for future in client.alter_user_scram_credentials(changes).values():
        _result(kafka, future, timeout=kafka.timeout_s)


def remove_user(kafka: KafkaSettings, name: str) -> None:
    """Remove the user's credentials (its ACLs stay until revoked)."""
    check_user(name)
    deletion: list[UserScramCredentialAlteration] = [
        UserScramCredentialDeletion(name, ScramMechanism.SCRAM_SHA_512)
    ]
    client = _admin(kafka)
    for future in client.alter_user_scram_credentials(deletion).values():
        try:
            _result(kafka, future, timeout=kafka.timeout_s)
        except KafkaException as exc:
            if _code(exc) == KafkaError.RESOURCE_NOT_FOUND:
                raise UnknownKafkaUserError(
                    f"no Kafka user {name!r} (see `kappaflow users list`)"
                ) from None
            raise


def list_users(kafka: KafkaSettings) -> list[User]:
    """Every user with SCRAM credentials, by name."""
    client = _admin(kafka)
    described = _result(kafka, client.describe_user_scram_credentials(), timeout=kafka.timeout_s)
    found = [
        User(name, tuple(sorted(info.mechanism.name for info in desc.scram_credential_infos)))
        for name, desc in described.items()
    ]
    return sorted(found, key=lambda user: user.name)


def grant(kafka: KafkaSettings, wanted: Iterable[Rule]) -> int:
    """Create the rules (one already there is kept); how many were asked for."""
    bindings = [rule.binding() for rule in wanted]
    if not bindings:
        return 0
    client = _admin(kafka)
    for future in client.create_acls(bindings).values():
        _result(kafka, future, timeout=kafka.timeout_s)
    return len(bindings)


def revoke(kafka: KafkaSettings, unwanted: Iterable[Rule]) -> list[Rule]:
    """Delete the rules; the ones that were there."""
    filters = [rule.matcher() for rule in unwanted]
    if not filters:
        return []
    deleted: list[Rule] = []
    client = _admin(kafka)
    for future in client.delete_acls(filters).values():
        deleted += [Rule.from_binding(b) for b in _result(kafka, future, timeout=kafka.timeout_s)]
    return deleted


def list_acls(kafka: KafkaSettings, user: str | None = None) -> list[Rule]:
    """Every rule, or ``user``'s."""
    principal = f"User:{check_user(user)}" if user is not None else None
    # librdkafka takes None for "any" where the stubs say str.
    anything: Any = None
    everything = AclBindingFilter(
        ResourceType.ANY,
        anything,
        ResourcePatternType.ANY,
        principal if principal is not None else anything,
        anything,
        AclOperation.ANY,
        AclPermissionType.ANY,
    )
    client = _admin(kafka)
    found = _result(kafka, client.describe_acls(everything), timeout=kafka.timeout_s)
    listed = [Rule.from_binding(b) for b in found]
    return sorted(listed, key=lambda r: (r.user, r.resource, r.name, r.operation))


def _admin(kafka: KafkaSettings) -> AdminClient:
    """An admin client of a cluster that answered (a clear error where it did not, or
    refused the credentials); the caller keeps it until its futures are done."""
    cluster_metadata(kafka)
    return admin(kafka)


def _code(exc: KafkaException) -> int | None:
    err = exc.args[0] if exc.args else None
    return err.code() if isinstance(err, KafkaError) else None


def _result(kafka: KafkaSettings, future: Any, *, timeout: float) -> Any:
    """A future's result; Kafka's refusals as our errors."""
    try:
        return future.result(timeout=timeout)
    except KafkaException as exc:
        if _code(exc) == KafkaError.SECURITY_DISABLED:
            raise SecurityUnavailableError(
                f"the broker at {kafka.bootstrap} has no authorizer: users and ACLs need "
                "security on (`kappaflow up --secure`, or kafka.secure = true)"
            ) from None
        mapped = kafka_error(kafka, exc)
        if mapped is not None:
            raise mapped from None
        raise
