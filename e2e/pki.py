"""The local cluster's PKI (openssl CLI; EC keys are fast to generate) and its admin kubeconfig."""
from __future__ import annotations

import base64
import shutil
import subprocess
from pathlib import Path

import yaml


def _openssl(*args: str, cwd: Path) -> None:
    r = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(f"openssl {' '.join(args)} failed: {r.stderr.strip()}")


def make_pki(pki: Path) -> None:
    pki.mkdir(parents=True, exist_ok=True)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "3650",
             "-subj", "/CN=v41flash-e2e-ca", "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature", cwd=pki)

    def leaf(name: str, subj: str, ext: str) -> None:
        _openssl("req", "-new", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subj, cwd=pki)
        (pki / f"{name}.ext").write_text(ext)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", f"{name}.crt", "-days", "365", "-extfile", f"{name}.ext", cwd=pki)

    server = "keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n"
    leaf("apiserver", "/CN=kube-apiserver",
         server + "subjectAltName=IP:127.0.0.1,IP:10.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,"
                  "DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local\n")
    leaf("admin", "/O=system:masters/CN=v41flash-e2e-admin",
         "keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n")
    leaf("lws-webhook", "/CN=lws-webhook", server + "subjectAltName=IP:127.0.0.1\n")
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=pki)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=pki)
    lws = pki / "lws"
    lws.mkdir(exist_ok=True)
    shutil.copy(pki / "lws-webhook.crt", lws / "tls.crt")
    shutil.copy(pki / "lws-webhook.key", lws / "tls.key")


def kubeconfig_yaml(server: str, pki: Path) -> str:
    b64 = lambda p: base64.b64encode((pki / p).read_bytes()).decode()  # noqa: E731
    return yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "v41flash-e2e",
        "clusters": [{"name": "v41flash-e2e", "cluster": {"server": server, "certificate-authority-data": b64("ca.crt")}}],
        "users": [{"name": "admin", "user": {"client-certificate-data": b64("admin.crt"),
                                              "client-key-data": b64("admin.key")}}],
        "contexts": [{"name": "v41flash-e2e", "context": {"cluster": "v41flash-e2e", "user": "admin"}}],
    })


# ---------------------------------------------------------------------------------------------------
