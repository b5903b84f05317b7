"""Spark on Kubernetes: the launcher and the objects it creates (see docs/kubernetes.md)."""

from runners.kubernetes.launcher import (
    RBAC_RULES,
    SPARK_DRIVER_RBAC_RULES,
    KubernetesApiError,
    KubernetesForbiddenError,
    KubernetesLauncher,
    RbacRule,
    pod_status,
)

__all__ = [
    "RBAC_RULES",
    "SPARK_DRIVER_RBAC_RULES",
    "KubernetesApiError",
    "KubernetesForbiddenError",
    "KubernetesLauncher",
    "RbacRule",
    "pod_status",
]
