"""The serving RayCluster and what goes with it.

One `Serving` component (`gpu-serving:serving:Serving`) turns the manifests of
`infra/k8s/raycluster.py`, `exposure.py` and `checks.py` (built from the plan) into Kubernetes objects:

- the RayCluster (`ray.io/v1`, a `CustomResource`), created and not awaited
  (`pulumi.com/skipAwait`, infra/k8s/raycluster.py): its pods wait for the
  weights themselves, then Ray joins and vLLM loads, which takes the staging
  time plus the plan's cold start; `python -m infra rollout` follows that and
  says when the endpoint answers. Its deletion is still awaited (the provider
  skips deletion waits only for built-in workload kinds), so on destroy KubeRay
  removes its pods and finalizers before the operators go;
- the Service for port 8000 (ClusterIP, or an internal NLB);
- the PodDisruptionBudget;
- a PodMonitor when `monitoring` is "podmonitor" (the pods carry scrape
  annotations otherwise);
- the EFA check (headless Service + Indexed Job) when enabled. It needs two
  whole GPU nodes, which the serving pods hold once they run, so it is never a
  prerequisite of the RayCluster and Pulumi does not wait for it
  (`pulumi.com/skipAwait`): an update of the RayCluster never waits on a check
  that cannot be scheduled. It depends only on the operators and the namespace
  (`check_depends_on`), not on the weights, so at first bring-up it is created
  while the weights are still being staged, before the RayCluster, whose pods
  are created later (by KubeRay) and then wait for the weights. Nothing
  guarantees the check's pods are scheduled first: if the serving pods take the
  GPU nodes, the check waits for two free nodes until its deadline. Its verdict is the Job's
  status (`kubectl -n <namespace> get job <name>-efa-check`, and its logs);
  a changed check (new image or scripts) replaces the Job, which runs again once
  two GPU nodes are free (a maintenance window);
- the serving benchmark Job when enabled, after the RayCluster and the Service.
  Pulumi waits for it (its verdict is the `up`'s). Since the RayCluster is not
  awaited, it starts when the RayCluster is created, so its wait for /health
  (the plan's `ready_wait_s`) and its deadline now also cover the weights'
  staging: on a first `up` of a large checkpoint it can give up before vLLM
  is ready. Turn it on once the stack serves;
- the ConfigMap of the scripts those pods run (`infra/k8s/scripts/`), before
  any of them;
- the serving layer's NetworkPolicies (infra/k8s/network_policies.py): the
  RayCluster's pods only with each other, the API port from the benchmark and
  the configured clients, the metrics and dashboard ports from theirs, the
  checks' own; all before any pod they select. The namespace's default deny
  and DNS policies come with the namespace (components/stack.py).

Ordering on destroy: the RayCluster `depends_on` the operator releases (KubeRay,
GPU operator, EFA device plugin) and the weights' storage, so Pulumi deletes it
first, while KubeRay still runs and can tear its pods and services down; an
operator removed before its custom resources leaves finalizers and stuck
namespaces behind (issue trackers of pulumi-eks, pulumi-kubernetes and KubeRay). The same
edges order creation: no RayCluster before KubeRay and the device plugins are
installed and the staging Job exists; that the weights are staged is the pods'
own wait (`wait_for_weights.sh`), not Pulumi's.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import pulumi
import pulumi_kubernetes as k8s
import pulumi_random as random

from infra.k8s import checks, exposure, network_policies, raycluster, serving_spec
from infra.k8s.serving_spec import ServingSpec

# Characters of the API key: letters and digits, 62 ** 48, about 286 bits.
API_KEY_LENGTH = 48

TYPE = "gpu-serving:serving:Serving"


@dataclass(frozen=True)
class ServingArgs:
    spec: ServingSpec
    # What must exist before the RayCluster and outlive it: the operator releases,
    # the weights' claim and staging Job.
    depends_on: Sequence[pulumi.Resource] = field(default_factory=tuple)
    # The serving image when it is only known as an Output (e.g. the stack's ECR
    # repository URL and tag); None: `spec.image`. One of the two names it. Names
    # and metadata never depend on it, so a preview shows every object; only the
    # pod specs wait for it.
    image: Optional[pulumi.Input[str]] = None
    # What the checks and the scripts' ConfigMap need (the operators and the
    # namespace; not the weights): None = `depends_on`.
    check_depends_on: Optional[Sequence[pulumi.Resource]] = None
    # The image the EFA check runs when it must not wait for `image` (the stack's own image by
    # digest is known once the weights are staged; the check runs while they are): None = `image`.
    check_image: Optional[pulumi.Input[str]] = None

    def __post_init__(self) -> None:
        if (self.image is None) == (self.spec.image is None):
            raise ValueError("ServingArgs: give the serving image once, as spec.image or as image")


def _timeout(seconds: int) -> str:
    return f"{max(1, -(-int(seconds) // 60))}m"


class Serving(pulumi.ComponentResource):
    """The vLLM RayCluster, its Service, disruption budget, monitoring and checks."""

    scripts: k8s.core.v1.ConfigMap
    raycluster: k8s.apiextensions.CustomResource
    service: k8s.core.v1.Service
    pdb: k8s.policy.v1.PodDisruptionBudget
    pod_monitor: Optional[k8s.apiextensions.CustomResource]
    efa_check: Optional[k8s.batch.v1.Job]
    benchmark: Optional[k8s.batch.v1.Job]
    network_policies: dict[str, k8s.networking.v1.NetworkPolicy]
    api_key: pulumi.Output[str]  # secret

    def __init__(self, name: str, args: ServingArgs, opts: Optional[pulumi.ResourceOptions] = None) -> None:
        super().__init__(TYPE, name, None, opts)
        spec = args.spec
        child = pulumi.ResourceOptions(parent=self)
        # The pods' scripts, before every pod that runs them (in the namespace, which
        # is among the prerequisites).
        scripts = raycluster.scripts_config_map(spec)
        check_deps = list(args.depends_on if args.check_depends_on is None else args.check_depends_on)
        before_pods = pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(depends_on=check_deps))
        self.scripts = k8s.core.v1.ConfigMap(
            f"{name}-scripts", metadata=scripts["metadata"], data=scripts["data"], opts=before_pods
        )
        # Who may talk to whom, before any pod they select exists.
        self.network_policies = {}
        for np in network_policies.serving_policies(spec):
            np_name = np["metadata"]["name"]
            self.network_policies[np_name] = self._typed(k8s.networking.v1.NetworkPolicy, f"{name}-np-{np_name}", np, before_pods)
        policies = list(self.network_policies.values())
        # The API key: random, kept in the state as a secret, handed to the pods through a Secret (the head's
        # VLLM_API_KEY, the benchmark's OPENAI_API_KEY) and exported as a secret output. Made once per stack:
        # nothing in its inputs changes, so it never rotates by accident (replace the resource to rotate it).
        key = random.RandomPassword(f"{name}-api-key", length=API_KEY_LENGTH, special=False, opts=child)
        self.api_key = pulumi.Output.secret(key.result)
        self.api_key_secret = k8s.core.v1.Secret(
            f"{name}-api-key",
            metadata={"name": spec.api_key_secret_name, "namespace": spec.namespace, "labels": dict(serving_spec.PART_OF)},
            type="Opaque",
            string_data={serving_spec.API_KEY_SECRET_KEY: self.api_key},
            opts=before_pods,
        )
        prerequisites = [*args.depends_on, self.scripts, self.api_key_secret, *policies]

        def built(builder: Callable[[ServingSpec], dict], image: Optional[pulumi.Input[str]] = args.image) -> pulumi.Input[dict]:
            """A builder's `spec`, with the image resolved when it is an Output."""
            if image is None:
                return builder(spec)["spec"]
            return pulumi.Output.from_input(image).apply(lambda img: builder(dataclasses.replace(spec, image=img))["spec"])

        self.efa_check = None
        if spec.efa_check:
            efa_svc = self._typed(k8s.core.v1.Service, f"{name}-efa-check", checks.efa_check_service(spec), child)
            self.efa_check = self._typed(
                k8s.batch.v1.Job,
                f"{name}-efa-check",
                {"metadata": checks.efa_check_job(spec)["metadata"], "spec": built(checks.efa_check_job, args.image if args.check_image is None else args.check_image)},
                pulumi.ResourceOptions.merge(
                    child,
                    pulumi.ResourceOptions(
                        # Not the RayCluster's prerequisite, nor awaited (module doc).
                        depends_on=[*check_deps, self.scripts, efa_svc, *policies],
                        # Fixed name: a changed Job must go before its replacement comes (at once:
                        # deleted in the background, checks.efa_check_job).
                        delete_before_replace=True,
                    ),
                ),
            )

        rc = raycluster.raycluster(spec)
        self.raycluster = k8s.apiextensions.CustomResource(
            f"{name}-raycluster",
            api_version=rc["apiVersion"],
            kind=rc["kind"],
            metadata=rc["metadata"],
            spec=built(raycluster.raycluster),
            opts=pulumi.ResourceOptions.merge(
                child,
                pulumi.ResourceOptions(
                    # Created after, deleted before, the operators and the weights (module doc).
                    depends_on=prerequisites,
                ),
            ),
        )

        self.service = self._typed(k8s.core.v1.Service, f"{name}-api", exposure.service(spec), child)
        self.pdb = self._typed(k8s.policy.v1.PodDisruptionBudget, f"{name}-pdb", exposure.pdb(spec), child)

        self.pod_monitor = None
        if spec.monitoring == "podmonitor":
            pm = exposure.pod_monitor(spec)
            self.pod_monitor = k8s.apiextensions.CustomResource(
                f"{name}-podmonitor",
                api_version=pm["apiVersion"],
                kind=pm["kind"],
                metadata=pm["metadata"],
                spec=pm["spec"],
                opts=child,
            )

        self.benchmark = None
        if spec.benchmark:
            run = _timeout(serving_spec.ready_timeout_s(spec) + checks.BENCHMARK_RUN_ALLOWANCE_S + 300)
            self.benchmark = self._typed(
                k8s.batch.v1.Job,
                f"{name}-benchmark",
                {"metadata": checks.benchmark_job(spec)["metadata"], "spec": built(checks.benchmark_job)},
                pulumi.ResourceOptions.merge(
                    child,
                    pulumi.ResourceOptions(
                        depends_on=[self.raycluster, self.service, self.scripts, self.api_key_secret, *policies],
                        delete_before_replace=True,
                        custom_timeouts=pulumi.CustomTimeouts(create=run, update=run),
                    ),
                ),
            )

        self.service_name = self.service.metadata.apply(lambda m: m["name"])
        # Known once the Service exists (its name is the spec's: exposure.service).
        self.endpoint = self.service_name.apply(lambda _: spec.endpoint)
        self.served_model_name = pulumi.Output.from_input(spec.served_model_name)
        self.register_outputs(
            {
                "service_name": self.service_name,
                "endpoint": self.endpoint,
                "served_model_name": self.served_model_name,
            }
        )

    @staticmethod
    def _typed(cls, resource_name: str, manifest: dict, opts: pulumi.ResourceOptions):  # noqa: ANN001
        """A typed pulumi-kubernetes resource from a manifest (metadata and spec, camelCase as in the API)."""
        return cls(resource_name, metadata=manifest["metadata"], spec=manifest["spec"], opts=opts)
