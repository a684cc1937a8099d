"""kopf hardened as production kopf operators are: our own annotation prefix and finalizer name, bounded watch
timeouts, no progress annotations copied anywhere (children are built by the renderer from the spec only),
handler return values never dumped into status; and kopf's login with the very configuration the operator's
own client loaded (--kubeconfig, in-cluster, default)."""
from __future__ import annotations

import logging
from typing import Any

import kopf

from ..api import v1alpha1 as api
from .redact import RedactingDiffBaseStorage


def harden(settings: kopf.OperatorSettings) -> None:
    # (kopf stores nothing on our objects: we register no change handlers; these names are ours if it ever does)
    settings.persistence.finalizer = f"{api.GROUP}/finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=api.GROUP)
    # escape-hatch values as digests: the annotation must not carry extraEnv text (controller/redact.py)
    settings.persistence.diffbase_storage = RedactingDiffBaseStorage(
        prefix=api.GROUP, key="last-handled-configuration")
    settings.watching.server_timeout = 300  # the apiserver ends each watch; kopf re-lists and resumes
    settings.watching.client_timeout = 330
    settings.watching.connect_timeout = 30
    settings.posting.reporting_component = "v41flash-operator"
    settings.posting.event_name_prefix = "v41flash-"
    settings.posting.level = logging.WARNING  # kopf posts only failures; ours go through Kube.post_event
    settings.execution.max_workers = 4  # kopf's own sync handlers only (login); passes have their own pool
    settings.batching.error_delays = (1, 2, 5, 10, 30, 60)


def connection_info(cfg: Any, settings: kopf.OperatorSettings) -> kopf.ConnectionInfo:
    """kopf's credentials from our client's kubernetes Configuration."""
    header = cfg.get_api_key_with_prefix("BearerToken") or cfg.get_api_key_with_prefix("authorization")
    parts = header.split(" ", 1) if header else []
    scheme, token = (None, None) if not parts else (None, parts[0]) if len(parts) == 1 else (parts[0], parts[1])
    return kopf.ConnectionInfo(
        server=cfg.host, ca_path=cfg.ssl_ca_cert, insecure=not cfg.verify_ssl,
        username=cfg.username or None, password=cfg.password or None, scheme=scheme, token=token,
        certificate_path=cfg.cert_file, private_key_path=cfg.key_file, trust_env=settings.networking.trust_env)
