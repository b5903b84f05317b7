#!/bin/bash
# Container entry point. Runs every command under tini (signals reach the process, zombies
# are reaped), so `kubectl delete pod` gives a job its SIGTERM before the SIGKILL.
#
#   executor  - started by Spark's Kubernetes scheduler for executor Pods: run Spark's
#               executor backend with the settings Spark passes in SPARK_* variables.
#   anything else is run as given (granian, celery, python -m runners.engine.main …).
set -euo pipefail

if [ "${1:-}" != "executor" ]; then
    exec /usr/bin/tini -s -- "$@"
fi

# Spark passes the executor's JVM options as SPARK_JAVA_OPT_0, SPARK_JAVA_OPT_1, … in order.
java_opts=()
while IFS= read -r name; do
    java_opts+=("${!name}")
done < <(compgen -e | grep '^SPARK_JAVA_OPT_' | sort -t_ -k4 -n)

classpath="${SPARK_CONF_DIR:-$SPARK_HOME/conf}:${SPARK_HOME}/jars/*"
if [ -n "${SPARK_EXTRA_CLASSPATH:-}" ]; then
    classpath="${classpath}:${SPARK_EXTRA_CLASSPATH}"
fi

exec /usr/bin/tini -s -- java \
    "${java_opts[@]}" \
    "-Xms${SPARK_EXECUTOR_MEMORY}" \
    "-Xmx${SPARK_EXECUTOR_MEMORY}" \
    -cp "$classpath" \
    org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend \
    --driver-url "$SPARK_DRIVER_URL" \
    --executor-id "$SPARK_EXECUTOR_ID" \
    --cores "$SPARK_EXECUTOR_CORES" \
    --app-id "$SPARK_APPLICATION_ID" \
    --hostname "$SPARK_EXECUTOR_POD_IP" \
    --resourceProfileId "${SPARK_RESOURCE_PROFILE_ID:-0}" \
    --podName "$SPARK_EXECUTOR_POD_NAME"
