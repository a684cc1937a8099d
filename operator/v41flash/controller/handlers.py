"""The kopf registrations, and only them: each hands its event to the module that owns the work.

* login, startup: kopf_setup (kopf logs in with our client's configuration; kopf hardened);
* a V41FlashDeployment's events, our workloads' events: watch (remember what was delivered, ask for a pass);
* startup, cleanup: periodic (the scheduler, the planners and the periodic loop).

Every trigger asks the one scheduler (controller/scheduler.py) for a pass of the same level-triggered
reconcile (controller/reconcile.py). The handlers find the process's Runtime in kopf's memo: cli/operator.py
passes it to kopf.run.
"""
from __future__ import annotations

from typing import Any

import kopf

from ..api import v1alpha1 as api
from ..render import labels as L
from ..render.engine import LWS_API_VERSION
from . import kopf_setup, periodic, watch


@kopf.on.login()
def login(settings: kopf.OperatorSettings, memo: kopf.Memo, **kwargs: Any) -> kopf.ConnectionInfo | None:
    runtime = memo.get("runtime")
    if runtime is None:
        return kopf.login_via_client(settings=settings, **kwargs)
    return kopf_setup.connection_info(runtime.kube.api_client.configuration, settings)


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    kopf_setup.harden(settings)


@kopf.on.event(api.GROUP, api.VERSION, api.PLURAL)
async def track(event: dict[str, Any], body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    watch.deployment_event(memo["runtime"], event.get("type"), body)


async def child_event(event: dict[str, Any], body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    watch.child_event(memo["runtime"], event.get("type"), body)


# our workloads only (labelled managed-by us): a Deployment or LWS of anyone else is no event of ours
kopf.on.event("apps", "v1", "deployments", labels={L.MANAGED_BY_LABEL: L.MANAGED_BY})(child_event)
kopf.on.event(*LWS_API_VERSION.split("/"), "leaderworkersets", labels={L.MANAGED_BY_LABEL: L.MANAGED_BY})(child_event)


@kopf.on.startup()
async def start_periodic(memo: kopf.Memo, **_: Any) -> None:
    periodic.start(memo["runtime"])


@kopf.on.cleanup()
async def stop_periodic(memo: kopf.Memo, **_: Any) -> None:
    periodic.stop(memo["runtime"])
