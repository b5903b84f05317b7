"""Executors that follow the parallelism when Spark runs on a cluster manager (Kubernetes or
a standalone cluster).

In local mode the cores are fixed (`local[n]`) and a live rescale only changes the number of
tasks. On a Kubernetes master each executor is a Pod, so a live rescale must also change the
number of Pods: `ExecutorPool.resize(p)` is called at every epoch boundary (before the epoch's
tasks) and keeps ``ceil(p / spark.executor.cores)`` executors.

- Up: ``SparkContext.requestTotalExecutors`` raises the scheduler's target; Spark's Kubernetes
  allocator creates the executor Pods, and the epoch's tasks use every executor registered by
  the time they are scheduled (the new ones join as their Pods start; nothing waits for them).
- Down: the executors beyond the target are killed with ``SparkContext.killExecutors`` (Spark
  deletes their Pods). That happens here, at the boundary: the previous epoch is committed and
  no task of the next one runs yet, so no task is lost with its executor. The highest executor
  ids go first (the newest Pods).

Dynamic allocation is not used: it sizes executors by the tasks pending, which would fight the
parallelism the control plane decided. With ``spark.dynamicAllocation.enabled=true`` or a
non-cluster master the pool does nothing.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark import SparkContext

log = logging.getLogger(__name__)

#: masters whose executors are separate processes the pool sizes (Kubernetes, standalone)
CLUSTER_MASTERS = ("k8s://", "spark://")
#: Spark's default executor count on Kubernetes when spark.executor.instances is unset
DEFAULT_INSTANCES = 2


class ExecutorPool:
    """The executors of a cluster-mode SparkContext, sized from the job's parallelism."""

    def __init__(self, sc: SparkContext) -> None:
        conf = sc.getConf()
        self._sc = sc
        dynamic = (conf.get("spark.dynamicAllocation.enabled") or "false").lower() == "true"
        master = str(sc.master)
        self.enabled = master.startswith(CLUSTER_MASTERS) and not dynamic
        self.cores = max(1, int(conf.get("spark.executor.cores") or "1"))
        self.target = int(conf.get("spark.executor.instances") or DEFAULT_INSTANCES)

    def needed(self, parallelism: int) -> int:
        """Executors for `parallelism` concurrent tasks."""
        return max(1, math.ceil(parallelism / self.cores))

    def registered(self) -> list[str]:
        """Ids of the executors registered with the driver now (the driver excluded)."""
        jvm: Any = self._sc._jvm
        ids = self._sc._jsc.sc().getExecutorIds()
        return [str(i) for i in jvm.scala.jdk.javaapi.CollectionConverters.asJava(ids)]

    def resize(self, parallelism: int) -> dict[str, int] | None:
        """Keep `needed(parallelism)` executors; call only between epochs. Returns what the
        epoch starts with: the target (`requested`), the executors registered when it was
        set (`registered`) and how many of them are being removed (`removing`); None when
        the pool is not enabled."""
        if not self.enabled:
            return None
        want = self.needed(parallelism)
        jvm: Any = self._sc._jvm
        jsc: Any = self._sc._jsc.sc()
        ids = sorted(self.registered(), key=_numeric)
        excess = ids[want:] if want < self.target else []
        if excess:
            jsc.killExecutors(jvm.scala.jdk.javaapi.CollectionConverters.asScala(excess).toSeq())
            log.info("parallelism %d: removing executors %s", parallelism, ", ".join(excess))
        if want != self.target:
            no_locality = jvm.org.apache.spark.api.python.PythonUtils.toScalaMap(
                jvm.java.util.HashMap()
            )
            if not jsc.requestTotalExecutors(want, 0, no_locality):
                log.warning("the cluster manager refused a target of %d executors", want)
            log.info("parallelism %d: %d executors (was %d)", parallelism, want, self.target)
            self.target = want
        return {"requested": self.target, "registered": len(ids), "removing": len(excess)}


def _numeric(executor_id: str) -> tuple[int, str]:
    return (int(executor_id), "") if executor_id.isdigit() else (1 << 62, executor_id)
