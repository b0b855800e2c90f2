"""TLS material for the stack's secured Kafka cluster: a certificate authority of the stack's own and
one server certificate it signs, made with `cryptography` (no hand-rolled ASN.1, no keytool).

The server certificate names only the IP address 127.0.0.1 (no DNS name), so a client that reaches
the same brokers as `localhost` sees "a certificate for another host" and must refuse it: that is
how the tests check that clients verify the broker's name. Kafka reads the PEM files directly
(`ssl.keystore.type=PEM`), librdkafka reads `ca.pem` (`ssl.ca.location`), and so does the JVM's Kafka
client in Spark (`ssl.truststore.type=PEM`).
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALID_DAYS = 3650
SERVER_IP = "127.0.0.1"


@dataclass(frozen=True)
class TlsFiles:
    ca_cert: Path  # the CA's certificate: what clients trust
    server_pem: Path  # the brokers' private key (PKCS#8, unencrypted) followed by their chain
    other_ca_cert: Path  # a second CA that signed nothing of ours: trusting it must fail


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Bottled Water local stack"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def _ca(common_name: str, now: datetime.datetime) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(_name(common_name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )  # fmt: skip
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def _server(
    ca_key: ec.EllipticCurvePrivateKey, ca_cert: x509.Certificate, now: datetime.datetime
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name("bottledwater-kafka"))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(SERVER_IP))]), critical=False
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        # Brokers are servers to clients and clients of each other (replication, the controllers).
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    return key, cert


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def ensure_tls(directory: Path) -> TlsFiles:
    """The CA and the server certificate under `directory`, made once (a restart keeps them, so
    clients holding `ca.pem` keep working); the private keys readable by their owner only."""
    files = TlsFiles(directory / "ca.pem", directory / "server.pem", directory / "other-ca.pem")
    if all(path.exists() for path in (files.ca_cert, files.server_pem, files.other_ca_cert)):
        return files
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    ca_key, ca_cert = _ca("Bottled Water local CA", now)
    server_key, server_cert = _server(ca_key, ca_cert, now)
    _, other_cert = _ca("Some other CA", now)
    key_pem = server_key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    files.server_pem.touch(mode=0o600)
    files.server_pem.write_bytes(key_pem + _pem(server_cert) + _pem(ca_cert))
    files.other_ca_cert.write_bytes(_pem(other_cert))
    files.ca_cert.write_bytes(_pem(ca_cert))
    return files
