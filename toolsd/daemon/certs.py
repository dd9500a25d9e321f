"""The daemon's TLS certificate and its server context (PROTOCOL.md 1.2, TLS 1.3 only).

`--tls-cert`/`--tls-key` name one; without them a self-signed one (ECDSA P-256, ten years)
is made at first start in the state folder (`tls/cert.pem`, `tls/key.pem`, 0600) and kept,
so its fingerprint, which clients pin, stays the same across restarts. The fingerprint is the
SHA-256 of the certificate's DER bytes.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import socket
import ssl

from toolsd.wire.urls import fingerprint_of

__all__ = ["Certificate", "CertificateError", "server_context", "self_signed", "given"]


class CertificateError(Exception):
    """A certificate or key toolsd cannot use; the message says what to do."""


class Certificate:
    def __init__(self, cert_path: str, key_path: str):
        self.cert_path = cert_path
        self.key_path = key_path
        with open(cert_path, "rb") as f:
            pem = f.read()
        try:
            der = ssl.PEM_cert_to_DER_cert(pem.decode("ascii"))
        except (ValueError, UnicodeDecodeError):
            raise CertificateError(f"{cert_path} is not a PEM certificate") from None
        self.fingerprint = fingerprint_of(der)


def server_context(cert: Certificate) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    try:
        context.load_cert_chain(cert.cert_path, cert.key_path)
    except (ssl.SSLError, OSError) as e:
        raise CertificateError(f"cannot use the certificate {cert.cert_path} with the key "
                               f"{cert.key_path}: {e}") from None
    # No session tickets: nothing resumable outlives a connection, nor costs memory.
    context.num_tickets = 0
    return context


def given(cert_path: str, key_path: str) -> Certificate:
    for path in (cert_path, key_path):
        if not os.path.isfile(path):
            raise CertificateError(f"{path}: no such file")
    return Certificate(cert_path, key_path)


def self_signed(folder: str, hosts: list[str]) -> Certificate:
    """The certificate in `folder`, made now if there is none (names: `hosts`, localhost)."""
    cert_path = os.path.join(folder, "cert.pem")
    key_path = os.path.join(folder, "key.pem")
    if os.path.exists(cert_path) and os.path.exists(key_path):
        return Certificate(cert_path, key_path)
    # Imported here: only a daemon that listens on TCP, the first time, needs it.
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    os.makedirs(folder, mode=0o700, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = [x509.DNSName("localhost")]
    for host in dict.fromkeys(hosts):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME,
                                            f"toolsd on {socket.gethostname()}"[:64])])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder()
            .subject_name(subject).issuer_name(subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=3650))
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    key_pem = key.private_bytes(serialization.Encoding.PEM,
                                serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(key_pem)
    with open(cert_path, "wb") as f:
        f.write(cert.public_bytes(serialization.Encoding.PEM))
    return Certificate(cert_path, key_path)
