"""resolve(): effective parallel sizes and GPUs per profile x GPU, and agreement with the CRD's CEL."""
import itertools

import pytest

from v41flash.api import v1alpha1 as api
from v41flash.facts import DEFAULT_CHECKPOINT
from v41flash.api.validation import cel_problems, defaulted
from v41flash.render.resolve import resolve


def spec(**kw):
    return api.V41FlashDeploymentSpec.model_validate(kw)


# (profile, product, decode overrides) -> (tp, dp, dp_local, ep, ep_size, nodes, gpus/replica, gpus/pod, kind)
TABLE = [
    ("low-latency", "H200", {}, (4, 1, 1, False, 1, 1, 4, 4, "Deployment")),
    ("low-latency", "H100", {}, (8, 1, 1, False, 1, 1, 8, 8, "Deployment")),
    ("low-latency", "B200", {}, (4, 1, 1, False, 1, 1, 4, 4, "Deployment")),
    ("low-latency", "GB300", {}, (4, 1, 1, False, 1, 1, 4, 4, "Deployment")),
    ("low-latency", "MI355X", {}, (4, 1, 1, False, 1, 1, 4, 4, "Deployment")),
    ("low-latency", "B300", {"tensorParallelSize": 2}, (2, 1, 1, False, 1, 1, 2, 2, "Deployment")),
    ("high-throughput", "B200", {}, (1, 2, 2, True, 2, 1, 2, 2, "Deployment")),
    # DEP2 where two GPUs hold the weights; H200 and H100 need more ranks
    ("high-throughput", "H200", {}, (1, 4, 4, True, 4, 1, 4, 4, "Deployment")),
    ("high-throughput", "H100", {}, (1, 8, 8, True, 8, 1, 8, 8, "Deployment")),
    ("high-throughput", "H200", {"dataParallelSize": 4}, (1, 4, 4, True, 4, 1, 4, 4, "Deployment")),
    ("high-throughput", "GB300", {"dataParallelSize": 4}, (1, 4, 4, True, 4, 1, 4, 4, "Deployment")),
    ("high-throughput", "GB300", {"dataParallelSize": 16, "nodesPerReplica": 4},
     (1, 16, 4, True, 16, 4, 16, 4, "LeaderWorkerSet")),
    ("high-throughput", "GB200", {"dataParallelSize": 8, "nodesPerReplica": 2},
     (1, 8, 4, True, 8, 2, 8, 4, "LeaderWorkerSet")),
    ("high-throughput", "B200", {"expertParallel": False}, (1, 2, 2, False, 1, 1, 2, 2, "Deployment")),
    ("low-latency", "H200", {"dataParallelSize": 2, "expertParallel": True},
     (4, 2, 2, True, 8, 1, 8, 8, "Deployment")),
]


@pytest.mark.parametrize("profile,product,overrides,want", TABLE,
                         ids=[f"{t[0]}-{t[1]}-{i}" for i, t in enumerate(TABLE)])
def test_resolve_table(profile, product, overrides, want):
    r = resolve(spec(profile=profile, gpu={"product": product}, decode=overrides)).decode
    got = (r.tensor_parallel_size, r.data_parallel_size, r.data_parallel_size_local, r.expert_parallel,
           r.expert_parallel_size, r.nodes_per_replica, r.gpus_per_replica, r.gpus_per_pod, r.workload_kind)
    assert got == want


def test_gpu_facts_per_vendor():
    nv = resolve(spec(gpu={"product": "GB300"})).gpu
    assert (nv.resource_name, nv.gpus_per_node, nv.product_label, nv.product_label_value) == (
        "nvidia.com/gpu", 4, "nvidia.com/gpu.product", "NVIDIA-GB300")
    amd = resolve(spec(gpu={"product": "MI355X"})).gpu
    # the default (NVIDIA GFD) label key would never match an AMD node: the product's own key is used
    assert (amd.resource_name, amd.product_label, amd.product_label_value) == (
        "amd.com/gpu", "amd.com/gpu.product-name", "AMD_Instinct_MI355X")
    custom = resolve(spec(gpu={"product": "H200", "productLabel": "example.com/gpu", "gpusPerNode": 4})).gpu
    assert (custom.product_label, custom.gpus_per_node) == ("example.com/gpu", 4)


def test_served_model_name_defaults_to_checkpoint():
    assert resolve(spec()).served_model_name == DEFAULT_CHECKPOINT
    assert resolve(spec(model={"servedModelName": "v41"})).served_model_name == "v41"


def test_kv_roles_and_aggregated():
    pd = resolve(spec())
    assert pd.disaggregated and (pd.prefill.kv_role, pd.decode.kv_role) == ("kv_producer", "kv_consumer")
    agg = resolve(spec(prefill={"enabled": False}))
    assert not agg.disaggregated and agg.decode.kv_role is None
    assert [r.role for r in agg.enabled_roles] == ["decode"]
    assert list(agg.roles) == ["prefill", "decode"]  # disabled roles stay resolvable (status, GPUs)


def test_min_gpus_counts_enabled_roles_only():
    s = spec(profile="high-throughput", gpu={"product": "GB300"},
             prefill={"dataParallelSize": 4, "minReplicas": 2},
             decode={"dataParallelSize": 16, "nodesPerReplica": 4, "minReplicas": 1})
    assert resolve(s).min_gpus() == 2 * 4 + 1 * 16
    assert resolve(spec(prefill={"enabled": False, "minReplicas": 3})).min_gpus() == 4


# 8- and 4-GPU nodes, both profiles, TP/DP that fit, do not split, or overflow a node
GRID = list(itertools.product(["H100", "GB300"], ["low-latency", "high-throughput"],
                              [None, 2, 8], [None, 2, 16], [1, 4]))


def test_resolve_agrees_with_the_crd_cel_rules():
    """Where CEL refuses a replica's shape, resolve's numbers say it does not fit, and vice versa."""
    checked = 0
    for product, profile, tp, dp, nodes in GRID:
        decode = {"nodesPerReplica": nodes}
        if tp:
            decode["tensorParallelSize"] = tp
        if dp:
            decode["dataParallelSize"] = dp
        obj = api.V41FlashDeployment.model_validate({
            "apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": "x"},
            "spec": {"profile": profile, "gpu": {"product": product}, "decode": decode}})
        paths = {p.path for p in cel_problems(defaulted(obj))}
        r = resolve(obj.spec)
        d, gpn = r.decode, r.gpu.gpus_per_node
        # one node: the replica fits it; several: it fills them exactly (only DP spans nodes)
        fits = d.tensor_parallel_size <= gpn and (
            d.gpus_per_replica <= gpn if d.nodes_per_replica == 1 else d.gpus_per_replica == d.nodes_per_replica * gpn)
        cel_fits = not ({"spec.decode.tensorParallelSize", "spec.decode.nodesPerReplica"} & paths)
        assert fits == cel_fits, (product, profile, tp, dp, nodes, paths)
        if fits:
            assert d.gpus_per_pod * d.nodes_per_replica == d.gpus_per_replica
        checked += 1
    assert checked == len(GRID)
