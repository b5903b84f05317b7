"""The Helm chart: lint, render with default and production-like values, validate every
manifest offline against the Kubernetes 1.33 schemas, and keep RBAC equal to the launcher's."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

from runners.kubernetes import RBAC_RULES, SPARK_DRIVER_RBAC_RULES, KubernetesLauncher, RbacRule
from runners.launchers import get_launcher
from tests.conftest import require_service
from tests.helm.conftest import CHART, Helm
from tests.security.servers import web_command

PRODUCTION = Path(__file__).with_name("production-values.yaml")
KUBERNETES_VERSION = "1.33.0"


def validate(manifests: list[dict[str, Any]]) -> None:
    require_service(
        "kubernetes-validate",
        importlib.util.find_spec("kubernetes_validate") is not None,
        "pip install kubernetes-validate (requirements/dev.in)",
    )
    import kubernetes_validate

    for manifest in manifests:
        kubernetes_validate.validate(manifest, KUBERNETES_VERSION, strict=True)


def by_kind(manifests: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {m["metadata"]["name"]: m for m in manifests if m["kind"] == kind}


def rules_of(role: dict[str, Any]) -> set[tuple[str, str, tuple[str, ...]]]:
    return {
        (group, resource, tuple(sorted(rule["verbs"])))
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    }


def expected(rules: tuple[RbacRule, ...]) -> set[tuple[str, str, tuple[str, ...]]]:
    return {(r.api_group, r.resource, tuple(sorted(r.verbs))) for r in rules}


def container(manifest: dict[str, Any]) -> dict[str, Any]:
    [only] = manifest["spec"]["template"]["spec"]["containers"]
    return only


@pytest.mark.parametrize("values", [[], [PRODUCTION]], ids=["defaults", "production"])
def test_chart_lints_clean(helm: Helm, values: list[Path]) -> None:
    args = ["lint", str(CHART), "--strict", "--namespace", "epochal"]
    for value in values:
        args += ["--values", str(value)]
    assert "0 chart(s) failed" in helm.run(*args).stdout


def test_default_render_is_valid_kubernetes(helm: Helm) -> None:
    manifests = helm.template()
    validate(manifests)
    kinds = sorted(f"{m['kind']}/{m['metadata']['name']}" for m in manifests)
    assert kinds == [
        "ConfigMap/epochal-settings",
        "Deployment/epochal-beat",
        "Deployment/epochal-control",
        "Deployment/epochal-web",
        "Deployment/epochal-worker",
        "Job/epochal-migrate",
        "Role/epochal-launcher",
        "Role/epochal-spark",
        "RoleBinding/epochal-launcher",
        "RoleBinding/epochal-spark",
        "Secret/epochal-settings",
        "Service/epochal",
        "ServiceAccount/epochal",
        "ServiceAccount/epochal-spark",
    ]
    assert {m["metadata"]["namespace"] for m in manifests} == {"epochal"}


def test_production_render_is_valid_kubernetes(helm: Helm) -> None:
    manifests = helm.template(PRODUCTION, namespace="epochal-system")
    validate(manifests)
    assert "Secret" not in {m["kind"] for m in manifests}  # both Secrets exist already
    ingress = by_kind(manifests, "Ingress")["epochal"]
    assert ingress["spec"]["ingressClassName"] == "nginx"
    assert ingress["spec"]["tls"] == [
        {"hosts": ["epochal.acme.com"], "secretName": "epochal-acme-tls"}
    ]
    assert ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"] == {
        "name": "epochal",
        "port": {"name": "http"},
    }
    web = by_kind(manifests, "Deployment")["epochal-web"]
    assert web["spec"]["replicas"] == 3
    assert "--workers=4" in container(web)["args"]
    pod = web["spec"]["template"]["spec"]
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod["nodeSelector"] == {"pool": "control-plane"}
    assert pod["tolerations"][0]["key"] == "dedicated"
    assert container(web)["image"] == "registry.example.com/platform/epochal:1.4.0"
    assert container(web)["envFrom"] == [
        {"configMapRef": {"name": "epochal-settings"}},
        {"secretRef": {"name": "epochal-settings-prod"}},
        {"secretRef": {"name": "epochal-store-prod"}},
    ]
    settings = by_kind(manifests, "ConfigMap")["epochal-settings"]["data"]
    assert settings["EPOCHAL_K8S_NAMESPACE"] == "streaming"
    assert settings["EPOCHAL_STORE_CREDENTIALS_SECRET"] == "epochal-store-prod"
    assert settings["EPOCHAL_JOB_SERVICE_ACCOUNT"] == "spark-jobs"
    assert settings["EPOCHAL_IMAGE_PULL_SECRETS"] == "regcred"
    assert "epochal.acme.com" in settings["DJANGO_ALLOWED_HOSTS"].split(",")
    assert "epochal.internal.acme.com" in settings["DJANGO_ALLOWED_HOSTS"].split(",")
    # RBAC lives where the jobs run; the launcher's binding names the control plane's account.
    roles = by_kind(manifests, "Role")
    assert {r["metadata"]["namespace"] for r in roles.values()} == {"streaming"}
    binding = by_kind(manifests, "RoleBinding")["epochal-launcher"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "epochal", "namespace": "epochal-system"}
    ]
    spark_sa = by_kind(manifests, "ServiceAccount")["spark-jobs"]
    assert spark_sa["metadata"]["namespace"] == "streaming"
    assert "eks.amazonaws.com/role-arn" in spark_sa["metadata"]["annotations"]


@pytest.mark.parametrize("values", [[], [PRODUCTION]], ids=["defaults", "production"])
def test_roles_grant_exactly_what_the_launcher_and_spark_use(
    helm: Helm, values: list[Path]
) -> None:
    roles = by_kind(helm.template(*values), "Role")
    assert rules_of(roles["epochal-launcher"]) == expected(RBAC_RULES)
    assert rules_of(roles["epochal-spark"]) == expected(SPARK_DRIVER_RBAC_RULES)


def test_settings_make_the_control_plane_launch_on_kubernetes(
    helm: Helm, monkeypatch: pytest.MonkeyPatch
) -> None:
    manifests = helm.template("store.accessKeyId=AKIAEXAMPLE", "store.secretAccessKey=s3cr3t")
    validate(manifests)
    settings = by_kind(manifests, "ConfigMap")["epochal-settings"]["data"]
    secrets = by_kind(manifests, "Secret")
    assert set(secrets["epochal-settings"]["stringData"]) == {
        "DATABASE_URL",
        "CELERY_BROKER_URL",
        "CACHE_URL",
        "DJANGO_SECRET_KEY",
    }
    assert len(secrets["epochal-settings"]["stringData"]["DJANGO_SECRET_KEY"]) == 50
    assert secrets["epochal-store"]["stringData"]["AWS_ACCESS_KEY_ID"] == "AKIAEXAMPLE"
    assert settings["RUNNER"] == "kubernetes"
    assert settings["STORE_URL"].startswith("s3://")
    for key, value in settings.items():
        monkeypatch.setenv(key, value)
    launcher = get_launcher()
    assert isinstance(launcher, KubernetesLauncher)
    web = by_kind(manifests, "Deployment")["epochal-web"]
    assert launcher.image == container(web)["image"] == "ghcr.io/epochal/epochal:0.1.0"
    assert launcher.namespace == "epochal"
    assert launcher.service_account == "epochal-spark"
    assert launcher.store_credentials_secret == "epochal-store"
    assert {"secretRef": {"name": "epochal-store"}} in container(web)["envFrom"]
    # Nothing secret in the ConfigMap.
    assert "s3cr3t" not in str(settings) and "AKIAEXAMPLE" not in str(settings)


def test_processes_probes_and_migration_hook(helm: Helm) -> None:
    manifests = helm.template()
    deployments = by_kind(manifests, "Deployment")
    web = container(deployments["epochal-web"])
    args = web["args"]
    assert args[:3] == ["granian", "--interface=wsgi", "controlplane.wsgi:application"]
    assert {"--port=8000", "--workers=2", "--blocking-threads=32", "--backpressure=512"} <= set(
        args
    )
    assert "--respawn-failed-workers" in args  # and exits when its workers die at start
    # the security and API tests' real servers run this command (but for the address and
    # the access log)
    tested = set(web_command(8000, workers=2, threads=32)[3:])
    assert {a.partition("=")[0] for a in tested ^ set(args[1:])} == {"--host", "--access-log"}
    # slow clients: headers within 10 s (bodies: EPOCHAL_BODY_SLOTS, docs/security.md)
    assert "--http1-header-read-timeout=10000" in args
    env = {e["name"]: e["value"] for e in web["env"]}
    assert env["EPOCHAL_WATCH_SLOTS"] == "24"  # of the 32 threads: 8 left for other requests
    assert env["EPOCHAL_BODY_SLOTS"] == "4"  # of those 8, at most 4 read request bodies
    assert web["readinessProbe"]["httpGet"] == {
        "path": "/healthz",
        "port": "http",
        "httpHeaders": [{"name": "Host", "value": "localhost"}],
    }
    assert web["livenessProbe"]["tcpSocket"] == {"port": "http"}
    assert web["resources"] == {
        "requests": {"cpu": "250m", "memory": "512Mi"},
        "limits": {"memory": "1Gi"},
    }
    worker = container(deployments["epochal-worker"])
    assert worker["args"][:3] == ["celery", "--app=controlplane", "worker"]
    # operations and the control loop on workers of their own: the reconciler and lineage
    # indexing never wait behind an operation
    assert "--queues=operations" in worker["args"]
    control = container(deployments["epochal-control"])
    assert control["args"][:3] == ["celery", "--app=controlplane", "worker"]
    assert "--queues=control" in control["args"]
    assert deployments["epochal-worker"]["spec"]["template"]["spec"]["serviceAccountName"] == (
        "epochal"
    )
    beat = deployments["epochal-beat"]
    assert container(beat)["args"][:3] == ["celery", "--app=controlplane", "beat"]
    assert beat["spec"]["replicas"] == 1 and beat["spec"]["strategy"] == {"type": "Recreate"}
    job = by_kind(manifests, "Job")["epochal-migrate"]
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    assert container(job)["args"] == ["python", "manage.py", "migrate", "--noinput"]
    for name in ("epochal-settings",):  # readable by the hook: hooks themselves, created first
        for kind in ("ConfigMap", "Secret"):
            hook = by_kind(manifests, kind)[name]["metadata"]["annotations"]
            assert hook["helm.sh/hook"] == "pre-install,pre-upgrade"
            assert int(hook["helm.sh/hook-weight"]) < int(
                job["metadata"]["annotations"]["helm.sh/hook-weight"]
            )


def test_notes_tell_how_to_log_in(helm: Helm) -> None:
    out = helm.run(
        "install", "epochal", str(CHART), "--namespace", "epochal", "--dry-run=client"
    ).stdout
    notes = out[out.index("NOTES:") :]
    assert "python manage.py createsuperuser" in notes
    # https by default: plain http over port-forward would be redirected
    assert "--set https=false" in notes
    out = helm.run(
        "install", "epochal", str(CHART), "--namespace", "epochal", "--dry-run=client",
        "--set", "https=false",
    ).stdout  # fmt: skip
    assert "port-forward service/epochal 8000:80" in out[out.index("NOTES:") :]


@pytest.mark.parametrize(
    ("setting", "complaint"),
    [
        ("store.url=file:///var/store", "/store/url"),
        ("web.replicas=-1", "/web/replicas"),
        ("database.url=mysql://db/epochal", "/database/url"),
        ("unknownKey=1", "unknownKey"),
    ],
)
def test_schema_refuses_bad_values(helm: Helm, setting: str, complaint: str) -> None:
    result = helm.run("template", "epochal", str(CHART), "--set", setting, check=False)
    assert result.returncode != 0
    assert complaint in result.stderr


def test_strict_validation_rejects_an_unknown_field() -> None:
    """The validator is really strict: a typo in a Pod spec does not pass."""
    require_service(
        "kubernetes-validate",
        importlib.util.find_spec("kubernetes_validate") is not None,
        "pip install kubernetes-validate (requirements/dev.in)",
    )
    import kubernetes_validate

    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "c", "image": "i", "imagePullPolicyy": "Always"}]},
    }
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(pod, KUBERNETES_VERSION, strict=True)


def test_the_web_servers_old_gunicorn_values_are_refused_by_name(helm: Helm) -> None:
    """`web.gunicornWorkers` / `web.gunicornThreads` (before the server was granian) are not
    silently ignored: the schema names them."""
    for old in ("web.gunicornWorkers=4", "web.gunicornThreads=16"):
        args = ["template", "epochal", str(CHART), "--set", old]
        refused = helm.run(*args, check=False)
        assert refused.returncode != 0
        assert old.split("=")[0].split(".")[1] in refused.stderr
