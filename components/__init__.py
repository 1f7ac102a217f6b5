"""Cloud components: one `pulumi.ComponentResource` per capability.

The components (network, cluster, GPU nodes, operators, model storage, the
serving RayCluster, observability) come with the cloud layer. Each one reads
every number it needs from the plan it is given (`infra.planning`) and never
invents one itself.
"""
