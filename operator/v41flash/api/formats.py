"""What the apiserver accepts in the child objects' fields, as patterns the CRD enforces at admission.

Each value a spec field is copied into (a Service name, a label key or value, a resource quantity, a
toleration) is held to the same format here, so a spec the apiserver would refuse in a child is refused
when the V41FlashDeployment itself is created, never halfway through an apply (issue 12).
"""
from __future__ import annotations

# DNS-1035 label: Service names are built from the CR's name (`<name>-router`, ...).
DNS1035_LABEL = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
# DNS-1123 subdomain: Secret, PVC and ConfigMap names.
DNS1123_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
# A label (or taint / node-selector) key: optional DNS prefix + '/' + a name of at most 63 characters.
_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_PREFIX = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
LABEL_KEY = rf"^({_PREFIX}/)?{_NAME}$"
LABEL_KEY_MAX = 316  # 253 prefix + '/' + 63 name... rounded to what the apiserver checks per part
# A label value: '' or at most 63 characters.
LABEL_VALUE = rf"^({_NAME})?$"
LABEL_VALUE_MAX = 63
# An extended resource name (domain/name), e.g. rdma/ib or nvidia.com/mlnxnics.
EXTENDED_RESOURCE = rf"^{_PREFIX}/{_NAME}$"
# resource.Quantity, unsigned (requests, limits and emptyDir sizes may not be negative).
QUANTITY = (r"^(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
            r"(([KMGTPE]i)|[numkMGTPE]|([eE][+-]?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$")
# A container image reference as the distribution spec's grammar has it (distribution/reference regexp.go): ASCII
# only, so a look-alike Unicode hyphen or slash (U+2010 in "vllm-openai") is refused instead of pulled from wherever it
# resolves. Character classes are spelled out: \w would be Unicode in the offline (Rust/Python) engines.
_ALNUM = r"[a-z0-9]+"
_PATH_COMPONENT = rf"{_ALNUM}(?:(?:[._]|__|[-]+){_ALNUM})*"
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_HOST = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[a-fA-F0-9:]+\])"
_IMAGE_NAME = rf"(?:{_HOST}(?::[0-9]+)?/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*"
_TAG = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
IMAGE = rf"^{_IMAGE_NAME}(?::{_TAG})?(?:@{_DIGEST})?$"
INT32_MAX = 2**31 - 1

# kvTransfer.extraConfig's bounds, enforced twice: by the CRD's schema (api/crd.bounded_json_schema: one
# schema node per container kind and level, so 2**(depth-1) nodes: keep the depth small) and by
# check_json_value. vLLM's kv_connector_extra_config nests 2-5 levels (a MultiConnector's list of connectors).
EXTRA_CONFIG_MAX_DEPTH = 8
EXTRA_CONFIG_MAX_ITEMS = 4096


def check_json_value(value: object, max_depth: int, max_items: int = EXTRA_CONFIG_MAX_ITEMS) -> None:
    """ValueError unless value nests at most max_depth levels, has at most max_items nodes and no string holds
    $( (the kubelet would expand it in the container argument it lands in). Iterative: a hostile depth
    cannot exhaust the stack."""
    stack: list[tuple[object, int]] = [(value, 1)]
    seen = 0
    while stack:
        node, depth = stack.pop()
        seen += 1
        if depth > max_depth:
            raise ValueError(f"nested deeper than {max_depth} levels")
        if seen > max_items:
            raise ValueError(f"more than {max_items} values")
        if isinstance(node, dict):
            for k, v in node.items():
                if "$(" in str(k):
                    raise ValueError("may not contain $(...): the kubelet expands it in container arguments")
                stack.append((v, depth + 1))
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node)
        elif isinstance(node, str) and "$(" in node:
            raise ValueError("may not contain $(...): the kubelet expands it in container arguments")
