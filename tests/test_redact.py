"""Escape-hatch values stay out of the ConfigMap and kopf's last-handled-configuration (issue 12)."""
import json

import kopf
import yaml

from v41flash.api.v1alpha1 import V41FlashDeployment
from v41flash.controller.redact import RedactingDiffBaseStorage, redact_spec
from v41flash.render import render

SECRET = "sk-live-do-not-leak"
SPEC = {"decode": {"extraEnv": [{"name": "MY_TOKEN", "value": SECRET}],
                   "extraArgs": ["--enable-log-requests"]}}


def test_config_map_does_not_copy_extra_env_or_args():
    cr = V41FlashDeployment.model_validate({"apiVersion": "v41flash.io/v1alpha1", "kind": "V41FlashDeployment",
                                            "metadata": {"name": "t", "namespace": "ns"}, "spec": SPEC})
    objs = render(cr)
    cm = next(o for o in objs if o["kind"] == "ConfigMap")
    text = cm["data"]["resolved.yaml"]
    assert SECRET not in text and "--enable-log-requests" not in text
    decode = yaml.safe_load(text)["roles"]["decode"]["commands"]["pod"]
    assert decode["env"]["MY_TOKEN"].startswith("<not shown")
    assert decode["command"][-1] == "<1 extraArgs not shown>"
    # ... while the pod itself still gets them
    pod = next(o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"] == "t-decode")
    c = pod["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "MY_TOKEN", "value": SECRET} in c["env"] and c["args"][-1] == "--enable-log-requests"


def test_diff_base_annotation_holds_digests_that_still_change():
    store = RedactingDiffBaseStorage(prefix="v41flash.io", key="last-handled-configuration")
    body = kopf.Body({"apiVersion": "v41flash.io/v1alpha1", "kind": "V41FlashDeployment",
                      "metadata": {"name": "t", "namespace": "ns"}, "spec": SPEC})
    essence = store.build(body=body)
    assert SECRET not in json.dumps(essence) and "--enable-log-requests" not in json.dumps(essence)
    changed = {"decode": {"extraEnv": [{"name": "MY_TOKEN", "value": SECRET + "2"}]}}
    assert redact_spec(changed) != redact_spec(SPEC)  # a new value is still an update
    assert SPEC["decode"]["extraEnv"][0]["value"] == SECRET  # input untouched
