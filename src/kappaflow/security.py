"""The embedded services' secrets: passwords, a certificate authority and certificates.

With ``kafka.secure`` on, the embedded broker speaks SASL/SCRAM-SHA-512 over TLS to its
clients and TLS with client certificates to its controller, and Redis wants a password.
What that needs is made once per state directory, under ``<state_dir>/security`` (the
directory 0700, every file 0600):

- ``secrets.json``: the passwords of the ``admin`` Kafka user (every kappaflow command and
  job uses it), of the broker's own user, and of Redis's ``kappaflow`` user;
- ``tls/ca.pem`` and ``tls/ca.key``: a certificate authority of this state directory;
- ``tls/broker.pem``: the broker's private key (PKCS#8, as Kafka's PEM key store wants it)
  followed by its certificate, valid for the broker's address, ``localhost`` and
  ``127.0.0.1``, for both server and client authentication (the broker shows it to its
  controller).

Nothing here talks to a service: the broker and Redis modules read these files.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from kappaflow.errors import SecurityMaterialError, StateDirError

#: The Kafka user every kappaflow command and job authenticates as.
ADMIN_USER: Final = "admin"
#: The broker's own Kafka user (it connects to itself and its peers as this one).
BROKER_USER: Final = "kafka-broker"
#: The Redis user the serving store's clients authenticate as.
REDIS_USER: Final = "kappaflow"
#: The broker certificate's subject; the controller knows the broker by it.
BROKER_CN: Final = "kappaflow-broker"
#: SCRAM's iteration count for the users kappaflow makes (Kafka accepts 4096 to 16384).
SCRAM_ITERATIONS: Final = 8192

_CA_DAYS = 3650
_CERT_DAYS = 825
# A certificate this close to its end is made again at the broker's next start.
_RENEW_BEFORE = dt.timedelta(days=30)


@dataclass(frozen=True)
class Secrets:
    admin_password: str
    broker_password: str
    redis_password: str

    def fingerprint(self) -> str:
        """A digest that changes when any password does (never the passwords)."""
        import hashlib

        joined = "\0".join((self.admin_password, self.broker_password, self.redis_password))
        return hashlib.sha256(joined.encode()).hexdigest()[:16]


class SecurityHome:
    """The files under ``<state_dir>/security``."""

    def __init__(self, state_dir: Path) -> None:
        self.root = (state_dir / "security").resolve()
        self.secrets_file = self.root / "secrets.json"
        self.tls_dir = self.root / "tls"
        self.ca_cert = self.tls_dir / "ca.pem"
        self.ca_key = self.tls_dir / "ca.key"
        self.broker_pem = self.tls_dir / "broker.pem"

    def secrets(self) -> Secrets:
        """The passwords, made on first use; every process of a state directory reads the
        same ones (the first writer wins, the others read what it wrote)."""
        if not self.secrets_file.exists():
            made = Secrets(*(secrets.token_urlsafe(24) for _ in range(3)))
            self._write_new(
                self.secrets_file,
                json.dumps(
                    {
                        "admin_password": made.admin_password,
                        "broker_password": made.broker_password,
                        "redis_password": made.redis_password,
                    },
                    indent=2,
                )
                + "\n",
            )
        try:
            data = json.loads(self.secrets_file.read_text())
            return Secrets(data["admin_password"], data["broker_password"], data["redis_password"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise SecurityMaterialError(
                f"cannot read {self.secrets_file} ({exc}): restore it from a backup; a new one "
                "would not match the credentials the broker keeps"
            ) from None

    def ensure_tls(self, hosts: tuple[str, ...]) -> list[str]:
        """Make the authority and the broker's certificate where they are missing, expire
        within 30 days, or do not cover ``hosts``; say what was made."""
        made: list[str] = []
        self._mkdir(self.tls_dir)
        if not (self.ca_cert.exists() and self.ca_key.exists()) or _expiring(self.ca_cert):
            self._make_ca()
            made.append(f"certificate authority {self.ca_cert}")
            self.broker_pem.unlink(missing_ok=True)
        if not self.broker_pem.exists() or not _covers(self.broker_pem, hosts):
            self._make_broker_cert(hosts)
            made.append(f"broker certificate {self.broker_pem}")
        return made

    def _make_ca(self) -> None:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name(
            [x509.NameAttribute(NameOID.COMMON_NAME, f"kappaflow CA {secrets.token_hex(4)}")]
        )
        now = dt.datetime.now(dt.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=_CA_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False
            )
            .sign(key, hashes.SHA256())
        )
        self._replace(self.ca_key, _pkcs8(key))
        self._replace(self.ca_cert, _pem(cert))

    def _make_broker_cert(self, hosts: tuple[str, ...]) -> None:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

        ca_cert = x509.load_pem_x509_certificate(self.ca_cert.read_bytes())
        ca_key = serialization.load_pem_private_key(self.ca_key.read_bytes(), password=None)
        if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
            raise SecurityMaterialError(f"{self.ca_key} is not the authority's EC key")
        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, BROKER_CN)]))
            .issuer_name(ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=_CERT_DAYS))
            .add_extension(x509.SubjectAlternativeName(_names(hosts)), critical=False)
            .add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
                ),
                critical=False,
            )
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                critical=False,
            )
            .sign(ca_key, hashes.SHA256())
        )
        self._replace(self.broker_pem, _pkcs8(key) + _pem(cert))

    def _mkdir(self, path: Path) -> None:
        try:
            path.mkdir(parents=True, exist_ok=True, mode=0o700)
            self.root.chmod(0o700)
        except OSError as exc:
            raise StateDirError(f"cannot create {path} ({exc.strerror})") from None

    def _write_new(self, path: Path, text: str) -> None:
        """Create ``path`` 0600 with ``text`` unless it exists (then keep what is there)."""
        self._mkdir(path.parent)
        partial = path.with_name(f".{path.name}.{os.getpid()}")
        try:
            fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as out:
                out.write(text)
                out.flush()
                os.fsync(out.fileno())
            try:
                # A hard link fails when the name exists: the first writer wins.
                os.link(partial, path)
            except FileExistsError:
                pass
            finally:
                partial.unlink()
        except OSError as exc:
            raise StateDirError(f"cannot write {path} ({exc.strerror})") from None

    def _replace(self, path: Path, data: bytes) -> None:
        partial = path.with_name(f".{path.name}.{os.getpid()}")
        try:
            fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as out:
                out.write(data)
            partial.replace(path)
        except OSError as exc:
            raise StateDirError(f"cannot write {path} ({exc.strerror})") from None


def _pkcs8(key: object) -> bytes:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    assert isinstance(key, ec.EllipticCurvePrivateKey)
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _pem(cert: object) -> bytes:
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    assert isinstance(cert, x509.Certificate)
    return cert.public_bytes(serialization.Encoding.PEM)


def _names(hosts: tuple[str, ...]) -> list[Any]:
    from cryptography import x509

    names: list[x509.GeneralName] = []
    for host in dict.fromkeys((*hosts, "localhost", "127.0.0.1")):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return list(names)


def _certificate(path: Path) -> object | None:
    from cryptography import x509

    try:
        return x509.load_pem_x509_certificate(path.read_bytes())
    except (OSError, ValueError):
        return None


def _expiring(path: Path) -> bool:
    from cryptography import x509

    cert = _certificate(path)
    if not isinstance(cert, x509.Certificate):
        return True
    return cert.not_valid_after_utc - dt.datetime.now(dt.UTC) < _RENEW_BEFORE


def _covers(path: Path, hosts: tuple[str, ...]) -> bool:
    """True if the certificate in ``path`` is current and names every one of ``hosts``."""
    from cryptography import x509

    if _expiring(path):
        return False
    cert = _certificate(path)
    if not isinstance(cert, x509.Certificate):
        return False
    try:
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return False
    have = {str(n) for n in names.get_values_for_type(x509.IPAddress)} | set(
        names.get_values_for_type(x509.DNSName)
    )
    return all(host in have for host in hosts)
