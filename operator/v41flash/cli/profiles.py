"""`v41flash profile show`: print what a capacity profile means; `v41flash profile apply`: put one in the ConfigMap
that a deployment's spec.autoscaling.capacityProfile names.

`v41flash profile build` (fitting a profile from a benchmark run) is evaluation tooling: the bench extra adds it to
this group (cli/main.py, entry points ``v41flash.commands``).
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from pydantic import ValidationError

from v41flash.planner import capacity
from v41flash.planner.profile import CapacityProfile, load_profile, shipped_profiles


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("profile", help="capacity profiles (build from a benchmark run, show)")
    sub = parser.add_subparsers(dest="profile_command", metavar="SUBCOMMAND")

    show = sub.add_parser("show", help="list shipped profiles, or print capacities of some")
    show.add_argument("profiles", nargs="*", help="shipped profile names or YAML files (none: list shipped)")
    show.add_argument("--isl", type=float, default=142_000, help="mean prompt tokens (default: AgentX median)")
    show.add_argument("--hit-rate", type=float, default=0.96, help="prefix-cache hit rate (default: AgentX 0.96)")
    show.add_argument("--osl", type=float, default=444, help="mean output tokens (default: AgentX median)")
    show.add_argument("--ttft", type=float, default=2.0, help="TTFT target, seconds")
    show.add_argument("--percentile", type=float, default=0.9, help="TTFT percentile (0.9 = p90)")
    show.add_argument("--itl", type=float, default=1 / 100, help="ITL target, seconds (default 10 ms = 100 tok/s/user)")
    show.add_argument("--yaml", action="store_true", help="print the profiles as YAML instead of a table")
    show.set_defaults(func=_show)

    apply = sub.add_parser(
        "apply", help="put a profile in a ConfigMap and name it in a deployment's spec.autoscaling.capacityProfile",
        description="Writes the profile (checked first) as profile.yaml of ConfigMap CONFIGMAP (default "
                    "<deployment>-capacity-profile) and sets the deployment's spec.autoscaling.capacityProfile to it; "
                    "the planner reads it on its next pass. --dry-run prints both objects instead (for Git).")
    apply.add_argument("--from", dest="source", required=True, type=Path, help="profile YAML (`profile build --out`)")
    apply.add_argument("--deployment", required=True, help="V41FlashDeployment name")
    apply.add_argument("--namespace", "-n", default="default")
    apply.add_argument("--configmap", help="ConfigMap name (default: <deployment>-capacity-profile)")
    apply.add_argument("--kubeconfig", help="kubeconfig (default: $KUBECONFIG, ~/.kube/config, or in-cluster)")
    apply.add_argument("--enable-planner", action="store_true",
                       help="also set spec.autoscaling.enabled: true (a deployment measured at fixed replicas)")
    apply.add_argument("--dry-run", action="store_true", help="print the ConfigMap and the CR's patch (a merge patch), apply nothing")
    apply.set_defaults(func=_apply)
    parser.set_defaults(func=lambda args: (parser.print_help(), 2)[1])


def _resolve(name: str) -> CapacityProfile:
    for p in shipped_profiles():
        if p.metadata.name == name:
            return p
    path = Path(name)
    if path.exists():
        return load_profile(path)
    known = ", ".join(p.metadata.name for p in shipped_profiles())
    raise ValueError(f"no shipped profile or file named {name!r} (shipped: {known})")


def capacity_row(p: CapacityProfile, isl: float, hit: float, osl: float, ttft: float, pct: float, itl: float) -> dict:
    """What one replica of each role sustains at the given workload and targets (per replica and per GPU)."""
    new, cached = isl * (1 - hit), isl * hit
    pre = capacity.prefill_replicas_needed(p.prefill, 1.0, new, cached, ttft, pct, target_utilization=1.0)
    prefill_rps = 1.0 / pre.replicas if pre.feasible and pre.replicas > 0 else 0.0
    ctx = isl + osl / 2
    batch = p.decode.batch_at_itl(itl, ctx)
    # a batch capped by max-num-seqs / KV runs faster than the target ITL
    decode_tps = p.decode.data_parallel_size * batch / min(itl, p.decode.itl_seconds(batch, ctx)) if batch > 0 else 0.0
    return {
        "profile": p.metadata.name,
        "layout": f"{p.prefill.parallelism}/{p.decode.parallelism}",
        "prefill_s": p.prefill.request_seconds(new, cached),
        "prefill_rps": prefill_rps,
        "prefill_rps_gpu": prefill_rps / p.prefill.gpus_per_replica,
        "decode_itl_b1_ms": p.decode.itl_seconds(1, ctx) * 1000,
        "decode_seqs": p.decode.data_parallel_size * batch,
        "decode_tps_gpu": decode_tps / p.decode.gpus_per_replica,
    }


def _show(args: argparse.Namespace) -> int:
    try:
        profiles = [_resolve(n) for n in args.profiles] if args.profiles else list(shipped_profiles())
    except (ValueError, OSError, ValidationError) as exc:
        print(f"profile show: {exc}", file=sys.stderr)
        return 1
    if args.yaml:
        sys.stdout.write("---\n".join(p.to_yaml() for p in profiles))
        return 0
    print(
        f"workload: ISL {args.isl:.0f} ({args.hit_rate:.0%} cached), OSL {args.osl:.0f}; "
        f"targets: TTFT p{args.percentile * 100:g} {args.ttft:g}s, ITL {args.itl * 1000:g}ms"
    )
    cols = ("profile", "layout", "prefill s", "prefill req/s/replica", "req/s/GPU", "ITL@b1 ms", "decode seqs/replica", "out tok/s/GPU")
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for p in profiles:
        r = capacity_row(p, args.isl, args.hit_rate, args.osl, args.ttft, args.percentile, args.itl)
        print(
            f"| {r['profile']} | {r['layout']} | {r['prefill_s']:.3f} | {r['prefill_rps']:.2f} | {r['prefill_rps_gpu']:.3f} "
            f"| {r['decode_itl_b1_ms']:.2f} | {r['decode_seqs']:.0f} | {r['decode_tps_gpu']:.0f} |"
        )
    return 0


def profile_configmap(profile_text: str, name: str, namespace: str) -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": namespace,
            "labels": {"app.kubernetes.io/component": "capacity-profile"}}, "data": {"profile.yaml": profile_text}}


def _apply(args: argparse.Namespace) -> int:
    import yaml

    try:
        text = args.source.read_text(encoding="utf-8")
        profile = load_profile(args.source)
    except (OSError, ValueError, ValidationError, yaml.YAMLError) as exc:
        print(f"profile apply: {args.source}: {exc}", file=sys.stderr)
        return 1
    name = args.configmap or f"{args.deployment}-capacity-profile"
    cm = profile_configmap(text, name, args.namespace)
    patch = {"spec": {"autoscaling": {"capacityProfile": name, **({"enabled": True} if args.enable_planner else {})}}}
    if args.dry_run:
        class Dumper(yaml.SafeDumper):  # profile.yaml as a block, readable in Git
            pass
        Dumper.add_representer(str, lambda d, v: d.represent_scalar("tag:yaml.org,2002:str", v,
                                                                    style="|" if "\n" in v else None))
        sys.stdout.write(yaml.dump_all([cm, {"apiVersion": "v41flash.io/v1alpha1", "kind": "V41FlashDeployment",
                                             "metadata": {"name": args.deployment, "namespace": args.namespace},
                                             **patch}], Dumper=Dumper, sort_keys=False))
        return 0
    import kubernetes
    from kubernetes.client.exceptions import ApiException

    try:
        if args.kubeconfig or not os.environ.get("KUBERNETES_SERVICE_HOST"):
            kubernetes.config.load_kube_config(config_file=args.kubeconfig)
        else:
            kubernetes.config.load_incluster_config()
        core, custom = kubernetes.client.CoreV1Api(), kubernetes.client.CustomObjectsApi()
        # the deployment first: a typo in its name must not leave a ConfigMap behind
        custom.get_namespaced_custom_object("v41flash.io", "v1alpha1", args.namespace, "v41flashdeployments",
                                            args.deployment)
        core.patch_namespaced_config_map(name, args.namespace, cm, field_manager="v41flash-profile-apply",
                                         force=True, _content_type="application/apply-patch+yaml")
        custom.patch_namespaced_custom_object("v41flash.io", "v1alpha1", args.namespace, "v41flashdeployments",
                                              args.deployment, patch, _content_type="application/merge-patch+json")
    except ApiException as exc:
        print(f"profile apply: {exc.status} {exc.reason}: {(exc.body or '')[:300]}", file=sys.stderr)
        return 1
    except kubernetes.config.ConfigException as exc:
        print(f"profile apply: no cluster configuration: {exc} (give --kubeconfig)", file=sys.stderr)
        return 1
    print(f"configmap/{name} (profile {profile.metadata.name}) applied in {args.namespace}; "
          f"v41f/{args.deployment} spec.autoscaling.capacityProfile={name}"
          + (", autoscaling.enabled=true" if args.enable_planner else "") + ": the planner uses it from its next pass")
    return 0
