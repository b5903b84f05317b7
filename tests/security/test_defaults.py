"""Production defaults: debug off unless asked for, no start without a secret key, secure
cookies / HSTS / https redirect for TLS deployments, `check --deploy` clean under the Helm
chart's production environment, and every setting documented in the README."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import requests

from controlplane.config import DEVELOPMENT_SECRET_KEY
from tests.conftest import require_service
from tests.helm.conftest import CHART, _fetch_helm
from tests.security.servers import (
    PROJECT_ROOT,
    clean_env,
    free_port,
    manage,
    new_secret_key,
    web_command,
    web_server,
)

PRODUCTION_VALUES = PROJECT_ROOT / "tests" / "helm" / "production-values.yaml"


def _settings_value(env: dict[str, str], expression: str) -> str:
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            f"import django; django.setup(); from django.conf import settings; print({expression})",
        ],
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return out.stdout.strip()


def test_debug_is_off_unless_the_environment_asks_for_it(tmp_path: Path) -> None:
    env = clean_env(tmp_path, DJANGO_SECRET_KEY=new_secret_key())
    assert _settings_value(env, "settings.DEBUG") == "False"
    assert _settings_value({**env, "DJANGO_DEBUG": "true"}, "settings.DEBUG") == "True"


def test_the_server_refuses_to_start_without_a_secret_key(tmp_path: Path) -> None:
    env = clean_env(tmp_path)
    checked = manage(env, "check", "--deploy")
    assert checked.returncode != 0
    assert "epochal.E001" in checked.stderr and "DJANGO_SECRET_KEY is not set" in checked.stderr
    # the chart's web command, two workers that restart when they die: it exits, it does not
    # restart them for ever
    served = subprocess.run(
        web_command(free_port(), workers=2),
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert served.returncode != 0
    assert "DJANGO_SECRET_KEY is not set" in served.stdout + served.stderr
    # Nor with the committed development key, which anyone can read.
    dev_key = manage({**env, "DJANGO_SECRET_KEY": DEVELOPMENT_SECRET_KEY}, "check", "--deploy")
    assert dev_key.returncode != 0 and "epochal.E001" in dev_key.stderr
    # Commands that serve nothing need no key; debug (the demo, the tests) uses the dev key.
    assert manage(env, "check").returncode == 0
    debug = manage({**env, "DJANGO_DEBUG": "true"}, "check", "--deploy")
    assert "epochal.E001" not in debug.stderr


def test_a_tls_deployment_gets_secure_cookies_hsts_and_the_https_redirect(tmp_path: Path) -> None:
    env = clean_env(tmp_path, DJANGO_SECRET_KEY=new_secret_key(), DJANGO_HTTPS="true")
    with web_server(env) as url:
        plain = requests.get(f"{url}/api/", allow_redirects=False, timeout=10)
        assert plain.status_code == 301
        assert plain.headers["Location"] == f"https://{url.removeprefix('http://')}/api/"
        # Probes and the scraper inside the cluster stay on http.
        probe = requests.get(f"{url}/healthz", allow_redirects=False, timeout=10)
        assert probe.status_code != 301
        # Behind the TLS-terminating Ingress.
        page = requests.get(f"{url}/login/", headers={"X-Forwarded-Proto": "https"}, timeout=10)
        assert page.status_code == 200
        assert page.headers["Strict-Transport-Security"] == (
            "max-age=31536000; includeSubDomains; preload"
        )
        cookie = next(c for c in page.cookies if c.name == "csrftoken")
        assert cookie.secure
    # Plain http deployments (no DJANGO_HTTPS): no redirect, no HSTS.
    env.pop("DJANGO_HTTPS")
    with web_server(env) as url:
        page = requests.get(f"{url}/login/", allow_redirects=False, timeout=10)
        assert page.status_code == 200
        assert "Strict-Transport-Security" not in page.headers


def _chart_env(tmp_path: Path, *args: str) -> dict[str, str]:
    """The web Pod's environment under the chart's values with `args` (`--values F`, `--set
    k=v`): the rendered ConfigMap, plus the keys of the chart's own settings Secret (production
    names an existing Secret that must hold the same keys), with a generated secret key."""
    import yaml

    binary, why = _fetch_helm()
    require_service("helm", binary is not None, why)
    home = {f"HELM_{k}_HOME": str(tmp_path / k.lower()) for k in ("CACHE", "CONFIG", "DATA")}

    def render(*args: str) -> list[dict[str, object]]:
        out = subprocess.run(
            [str(binary), "template", "epochal", str(CHART), *args],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
            env={**clean_env(tmp_path), **home},
        ).stdout
        return [doc for doc in yaml.safe_load_all(out) if doc]

    [config_map] = [m for m in render(*args) if m["kind"] == "ConfigMap"]
    data: dict[str, str] = dict(config_map["data"])  # type: ignore[call-overload]
    assert data["DJANGO_DEBUG"] == "false"
    [own_secret] = [m for m in render() if m["kind"] == "Secret"]
    secret_keys = set(own_secret["stringData"])  # type: ignore[call-overload]
    assert secret_keys == {"DATABASE_URL", "CELERY_BROKER_URL", "CACHE_URL", "DJANGO_SECRET_KEY"}
    secret = {
        "DATABASE_URL": "postgres://epochal@db.acme.internal:5432/epochal",
        "CELERY_BROKER_URL": "redis://redis.acme.internal:6379/0",
        "CACHE_URL": "redis://redis.acme.internal:6379/2",
        "DJANGO_SECRET_KEY": new_secret_key(),
    }
    # The Pod's /var/lib/epochal is a volume; here a scratch directory stands in for it.
    return clean_env(tmp_path, **{**data, **secret, "EPOCHAL_VAR_DIR": str(tmp_path / "var")})


def _deploy_check(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return manage(env, "check", "--deploy", "--fail-level", "WARNING")


def test_check_deploy_prints_no_warning_under_the_charts_production_environment(
    tmp_path: Path,
) -> None:
    env = _chart_env(tmp_path, "--values", str(PRODUCTION_VALUES))
    assert env["DJANGO_HTTPS"] == "true"
    checked = _deploy_check(env)
    assert checked.returncode == 0, checked.stderr
    assert "System check identified no issues (0 silenced)." in checked.stdout
    assert "WARNING" not in checked.stderr.upper() and "?:" not in checked.stderr
    # The same check does fail on what the chart fixes (so it can fail): plain http, no cache.
    for name in ("DJANGO_HTTPS", "CACHE_URL"):
        loose = {k: v for k, v in env.items() if k != name}
        assert _deploy_check(loose).returncode != 0


def test_the_charts_default_values_pass_check_deploy(tmp_path: Path) -> None:
    """https is on by default (no Ingress needed: TLS may end at a load balancer); plain http
    takes an explicit `https=false`, and then the check warns, as docs/kubernetes.md says."""
    env = _chart_env(tmp_path)
    assert env["DJANGO_HTTPS"] == "true"
    assert env["EPOCHAL_TRUSTED_PROXIES"] and env["EPOCHAL_API_ADDRESS_RATE"]
    checked = _deploy_check(env)
    assert checked.returncode == 0, checked.stderr
    assert "System check identified no issues (0 silenced)." in checked.stdout
    plain = _chart_env(tmp_path, "--set", "https=false")
    assert plain["DJANGO_HTTPS"] == "false"
    warned = _deploy_check(plain)
    assert warned.returncode != 0
    for check in ("security.W004", "security.W008", "security.W012", "security.W016"):
        assert check in warned.stderr


def test_a_short_secret_key_stops_the_server(tmp_path: Path) -> None:
    for key in ("x", "a" * 60, new_secret_key()[:49]):  # too short; one character repeated
        env = clean_env(tmp_path, DJANGO_SECRET_KEY=key)
        checked = manage(env, "check", "--deploy")
        assert checked.returncode != 0 and "epochal.E001" in checked.stderr
        served = subprocess.run(
            web_command(free_port()),
            cwd=PROJECT_ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert served.returncode != 0
        assert "the server will not start with fewer than 50" in served.stdout + served.stderr
    # debug (the demo, the tests) is not held to it
    debug = manage({**clean_env(tmp_path, DJANGO_SECRET_KEY="x"), "DJANGO_DEBUG": "true"}, "check")
    assert debug.returncode == 0, debug.stderr


def test_every_setting_is_in_the_readme_configuration_table() -> None:
    names: set[str] = set()
    for module in ("controlplane/settings.py", "controlplane/config.py"):
        source = (PROJECT_ROOT / module).read_text()
        names |= set(re.findall(r"env(?:_bool|_int)?\(\s*\"([A-Z][A-Z0-9_]+)\"", source))
    assert {"DJANGO_DEBUG", "DJANGO_SECRET_KEY", "DJANGO_HTTPS", "CACHE_URL"} <= names
    readme = (PROJECT_ROOT / "README.md").read_text()
    table = readme.split("## Configuration", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"^\| `([A-Z][A-Z0-9_]+)`", table, re.MULTILINE))
    assert sorted(names - documented) == []
