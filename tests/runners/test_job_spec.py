from __future__ import annotations

import pytest

from runners.job_spec import JobSpec, JobSpecError, Resources, Toleration, memory_with_overhead_mb
from runners.launcher import LauncherError
from runners.launchers import get_launcher
from runners.local import LocalLauncher


def test_job_spec_round_trips_through_json_form(make_spec) -> None:  # type: ignore[no-untyped-def]
    spec = make_spec(
        max_epochs=5,
        resources=Resources(executor_cores=2, executor_memory_mb=3072),
        node_selector={"pool": "spark"},
        tolerations=[Toleration(key="dedicated", value="spark", effect="NoSchedule")],
        image_pull_secrets=["regcred"],
        store_credentials_secret="store-creds",
        spark_conf={"spark.sql.shuffle.partitions": "8"},
        sinks=[{"name": "rows", "kind": "postgres", "config": {"password_env": "ROWS_PW"}}],
        sink_credentials_env={"rows": "ROWS_PW"},
        sink_secrets={"rows": "rows-db"},
    )
    again = JobSpec.from_dict(spec.to_dict())
    assert again == spec
    assert again.tolerations[0].to_kubernetes() == {
        "key": "dedicated",
        "operator": "Equal",
        "value": "spark",
        "effect": "NoSchedule",
    }


def test_engine_arguments_match_the_engine_command_line(make_spec) -> None:  # type: ignore[no-untyped-def]
    spec = make_spec(max_epochs=7)
    assert spec.engine_arguments() == [
        "--job", "sample-epochs", "--store", spec.store_url,
        "--namespace", "orders", "--branch", "main", "--parallelism", "2", "--max-epochs", "7",
    ]  # fmt: skip
    assert "--max-epochs" not in make_spec().engine_arguments()


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"job": "runners.jobs.clickstream:job"}, "job"),
        ({"job": "../x"}, "job"),
        ({"parallelism": 0}, "parallelism"),
        ({"branch": "../escape"}, "branch"),
        ({"namespace": "a/b"}, "namespace"),
        ({"max_epochs": 0}, "max_epochs"),
        ({"run_id": "Not_Valid"}, "run_id"),
        ({"spark_conf": {"executor.cores": "2"}}, "spark_conf"),
        ({"store_url": " "}, "store_url"),
        ({"sink_secrets": {"rows": "rows-db"}}, "sink_secrets"),  # names no sink of the job
        (
            {
                "sinks": [{"name": "rows", "kind": "postgres", "config": {}}],
                "sink_secrets": {"rows": "Rows_DB"},
            },
            "sink_secrets",
        ),
        (
            {
                "sinks": [{"name": "rows", "kind": "postgres", "config": {}}],
                "sink_credentials_env": {"rows": "ROWS-PW"},
            },
            "sink_credentials_env",
        ),
    ],
)
def test_invalid_job_specs_are_refused_naming_the_field(make_spec, changes, field) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(JobSpecError) as err:
        make_spec(**changes)
    assert field.split("_")[0] in str(err.value).lower() or "name" in str(err.value).lower()


def test_executor_count_follows_parallelism_unless_fixed() -> None:
    assert Resources(executor_cores=1).executor_count(3) == 3
    assert Resources(executor_cores=2).executor_count(3) == 2
    assert Resources(executor_cores=4).executor_count(1) == 1
    assert Resources(executors=5).executor_count(2) == 5
    with pytest.raises(JobSpecError, match="executor_cores"):
        Resources(executor_cores=0)
    assert memory_with_overhead_mb(1024) == 1024 + 384
    with pytest.raises(JobSpecError, match=r"resources\.standby must be true or false"):
        Resources(standby="yes")  # type: ignore[arg-type]
    assert memory_with_overhead_mb(8192) == 8192 + 820


def test_runner_env_selects_the_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RUNNER", raising=False)
    assert isinstance(get_launcher(), LocalLauncher)
    monkeypatch.setenv("RUNNER", "kubernetes")
    monkeypatch.setenv("EPOCHAL_K8S_NAMESPACE", "jobs")
    monkeypatch.setenv("EPOCHAL_IMAGE", "registry.example/epochal:1.0")
    launcher = get_launcher()
    assert launcher.name == "kubernetes"
    monkeypatch.setenv("RUNNER", "yarn")
    with pytest.raises(LauncherError, match="use local, kubernetes, standalone"):
        get_launcher()


def test_both_launchers_implement_the_one_protocol(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from runners.kubernetes import KubernetesLauncher
    from runners.launcher import Launcher

    local = LocalLauncher(runs_dir=tmp_path)
    kubernetes = KubernetesLauncher(namespace="jobs", image="epochal:1")
    assert isinstance(local, Launcher) and isinstance(kubernetes, Launcher)
    assert (local.name, kubernetes.name) == ("local", "kubernetes")
