"""Start a SparkSession exactly as the engine does (build_spark_session, env from the Pod) and wait.

Used by test_spark_config.py: the environment is the driver Pod's, pointed at the API double.
"""

from __future__ import annotations

import os
import time

from runners.engine.session import build_spark_session

spark = build_spark_session(master=os.environ["SPARK_MASTER"], app_name="epochal-spark-probe")
conf = spark.sparkContext.getConf()
print(
    f"session-ready {spark.sparkContext.master} driver.host={conf.get('spark.driver.host')}",
    flush=True,
)
time.sleep(600)
