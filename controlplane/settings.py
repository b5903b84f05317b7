"""Django settings. Every value comes from the environment (see controlplane/config.py)."""

from __future__ import annotations

from datetime import timedelta

import dj_database_url
from kombu import Exchange, Queue

from controlplane import config

BASE_DIR = config.BASE_DIR
VAR_DIR = config.VAR_DIR
VAR_DIR.mkdir(parents=True, exist_ok=True)

# Production by default: debug only where asked for (bin/demo, the tests); outside debug the
# server refuses to start without DJANGO_SECRET_KEY (controlplane/deployment.py, wsgi.py).
DEBUG = config.env_bool("DJANGO_DEBUG", False)
SECRET_KEY = config.secret_key(debug=DEBUG)
ALLOWED_HOSTS = [
    host
    for host in config.env("DJANGO_ALLOWED_HOSTS", "localhost,127.0.0.1,[::1]").split(",")
    if host
]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "axes",  # before controlplane.accounts: its login-failure handler runs first
    "controlplane.accounts",
    "controlplane.applications",
    "controlplane.lineage",
    "controlplane.jobs",
    "controlplane.operations",
    "controlplane.audit",
    "controlplane.autoscaler",
    "controlplane.changes",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "controlplane.api",
    "django_htmx",
    "web",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    # audits the refusals below it (and the dashboard's), then refuses oversized or NUL-laden
    # requests and reads bodies in bounded threads, before any view (docs/security.md)
    "controlplane.api.middleware.RefusalAuditMiddleware",
    "controlplane.api.middleware.BodyLimitMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "axes.middleware.AxesMiddleware",
]

# TLS deployments (behind an Ingress that terminates TLS): DJANGO_HTTPS=true turns on secure
# cookies, HSTS and the redirect to https; each can be tuned on its own.
HTTPS = config.env_bool("DJANGO_HTTPS", False)
SESSION_COOKIE_SECURE = config.env_bool("DJANGO_SESSION_COOKIE_SECURE", HTTPS)
CSRF_COOKIE_SECURE = config.env_bool("DJANGO_CSRF_COOKIE_SECURE", HTTPS)
SECURE_SSL_REDIRECT = config.env_bool("DJANGO_SECURE_SSL_REDIRECT", HTTPS)
# Probes and the Prometheus scraper talk plain http inside the cluster.
SECURE_REDIRECT_EXEMPT = [r"^healthz(/live|/ready)?$", r"^metrics$"]
SECURE_HSTS_SECONDS = config.env_int("DJANGO_HSTS_SECONDS", 31536000 if HTTPS else 0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = config.env_bool("DJANGO_HSTS_INCLUDE_SUBDOMAINS", HTTPS)
SECURE_HSTS_PRELOAD = config.env_bool("DJANGO_HSTS_PRELOAD", HTTPS)
# Proxies (addresses or networks) whose X-Forwarded-For names the client: lockouts, throttles
# and rejection counts key on that address (controlplane/proxies.py). Empty: REMOTE_ADDR.
EPOCHAL_TRUSTED_PROXIES = config.trusted_proxies()
if config.env_bool("DJANGO_TRUST_X_FORWARDED_PROTO", HTTPS):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_AGE = config.env_int("DJANGO_SESSION_AGE_S", 12 * 3600)
X_FRAME_OPTIONS = "DENY"

# Request bodies over this get 413 (controlplane/api/middleware.py); forms and fields too.
DATA_UPLOAD_MAX_MEMORY_SIZE = config.env_int("EPOCHAL_MAX_BODY_BYTES", 1024 * 1024)
DATA_UPLOAD_MAX_NUMBER_FIELDS = 1000
# Bodies are read by at most this many threads per process at once (the others answer 503 at
# once), each within this many seconds (408): controlplane/api/request_bodies.py.
EPOCHAL_BODY_SLOTS = config.env_int("EPOCHAL_BODY_SLOTS", 4)
EPOCHAL_BODY_TIMEOUT_S = config.env_int("EPOCHAL_BODY_TIMEOUT_S", 30)

# Shared by every process when CACHE_URL is redis://…: login lockouts and API throttles.
CACHES = {"default": config.cache_backend(config.cache_url())}

ROOT_URLCONF = "controlplane.urls"
WSGI_APPLICATION = "controlplane.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {"default": dj_database_url.parse(config.database_url(), conn_max_age=60)}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # Several processes write (web, worker, beat): wait for locks, take them up front.
    DATABASES["default"]["OPTIONS"] = {
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        "transaction_mode": "IMMEDIATE",
        "timeout": 30,
    }
    DATABASES["default"]["CONN_MAX_AGE"] = 0
# PostgreSQL: with EPOCHAL_DB_POOL_SIZE > 0 each process keeps a pool of that many connections
# (psycopg_pool) that its threads borrow per request instead of one persistent connection per
# thread: a web server's many threads (most holding waiting watches, which give their
# connection back) then need only as many connections as requests run at once. The web
# server sets it (helm/, bench.api); workers and commands keep one connection per thread.
EPOCHAL_DB_POOL_SIZE = config.env_int("EPOCHAL_DB_POOL_SIZE", 0)
if DATABASES["default"]["ENGINE"].endswith("postgresql") and EPOCHAL_DB_POOL_SIZE > 0:
    DATABASES["default"]["CONN_MAX_AGE"] = 0  # the pool keeps them; Django must not
    DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
        "min_size": min(2, EPOCHAL_DB_POOL_SIZE),
        "max_size": EPOCHAL_DB_POOL_SIZE,
        "timeout": 10,  # a request waits this long for a free connection, then fails (500)
        "max_idle": 300,
    }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# Sign-ins: django-axes locks a username and address out after EPOCHAL_LOGIN_FAILURE_LIMIT
# failures for EPOCHAL_LOGIN_LOCKOUT_MINUTES, counting in the shared cache (CACHE_URL);
# controlplane/accounts/logins.py audits them.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
AXES_HANDLER = "axes.handlers.cache.AxesCacheHandler"
AXES_FAILURE_LIMIT = config.env_int("EPOCHAL_LOGIN_FAILURE_LIMIT", 5)
AXES_COOLOFF_TIME = timedelta(minutes=config.env_int("EPOCHAL_LOGIN_LOCKOUT_MINUTES", 15))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
# The address behind the trusted proxies (X-Forwarded-For only from them: controlplane/proxies.py).
AXES_CLIENT_IP_CALLABLE = "controlplane.proxies.client_address"
AXES_RESET_ON_SUCCESS = True
AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT = False
AXES_HTTP_RESPONSE_CODE = 429
AXES_LOCKOUT_TEMPLATE = "web/locked_out.html"
AXES_VERBOSE = False
AXES_ENABLE_ADMIN = False  # the cache handler keeps no attempt rows to show
if CACHES["default"]["BACKEND"].endswith("LocMemCache"):
    # Per-process counting is what one process (the demo, tests) wants; production sets
    # CACHE_URL, and `check --deploy` warns when it does not (epochal.W001).
    SILENCED_SYSTEM_CHECKS = ["axes.W001"]

# Checked wherever a user is created or a password set: createuser, the admin, the API.
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"
STATIC_ROOT.mkdir(parents=True, exist_ok=True)
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}
WHITENOISE_USE_FINDERS = True
STATICFILES_FINDERS = [
    "django.contrib.staticfiles.finders.FileSystemFinder",
    "django.contrib.staticfiles.finders.AppDirectoriesFinder",
    "web.finders.PackageDataFinder",  # plotly.min.js from the plotly package (no CDN)
]

LOGIN_URL = "web:login"
LOGIN_REDIRECT_URL = "web:overview"
LOGOUT_REDIRECT_URL = "web:login"

# Celery: a broker that needs no server by default (filesystem), Redis or RabbitMQ in production.
CELERY_BROKER_URL = config.broker_url()
CELERY_RESULT_BACKEND = config.env("CELERY_RESULT_BACKEND", "") or None
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_ALWAYS_EAGER = config.env_bool("CELERY_TASK_ALWAYS_EAGER", False)
# A broker that is away fails a send within this many seconds (a connection to it, an answer
# from it), so an operation request is answered — recorded, dispatched later by the
# reconciler — rather than held (docs/operations-runbook.md).
EPOCHAL_BROKER_TIMEOUT_S = config.broker_timeout_s()
CELERY_BROKER_CONNECTION_TIMEOUT = EPOCHAL_BROKER_TIMEOUT_S
CELERY_BROKER_TRANSPORT_OPTIONS: dict[str, object] = {}
if CELERY_BROKER_URL.startswith(("redis://", "rediss://")):
    CELERY_BROKER_TRANSPORT_OPTIONS = {**config.redis_broker_options(EPOCHAL_BROKER_TIMEOUT_S)}
if CELERY_BROKER_URL.startswith("filesystem://"):
    _broker_dir = VAR_DIR / "broker"
    for _sub in ("out", "processed", "control"):
        (_broker_dir / _sub).mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_broker_dir / "out"),
        "data_folder_out": str(_broker_dir / "out"),
        "processed_folder": str(_broker_dir / "processed"),
        "control_folder": str(_broker_dir / "control"),
        "store_processed": False,
        "polling_interval": 0.1,
    }

# Two queues, so the control loop never waits behind an operation (an operation may wait
# minutes for a run to start or an epoch to commit): `operations` runs `epochal.run_operation`;
# `control` runs everything else — the reconciler, the run watch, lineage indexing, the
# autoscaler, gc. The demo and the Helm chart give each queue workers of its own (`-Q`); a
# worker started without `-Q` consumes both.
# Each queue has its own exchange and routing key: a Queue without them gets the default
# queue's, and a message for one would reach both.
_QUEUES = ("control", "operations")
CELERY_TASK_QUEUES = tuple(Queue(name, Exchange(name), routing_key=name) for name in _QUEUES)
CELERY_TASK_DEFAULT_QUEUE = "control"
CELERY_TASK_ROUTES = {"epochal.run_operation": {"queue": "operations"}}

CELERY_BEAT_SCHEDULE = {
    "reconcile": {
        "task": "epochal.reconcile",
        "schedule": float(config.env("EPOCHAL_RECONCILE_INTERVAL_S", "5")),
    },
    "watch-runs": {
        "task": "epochal.watch_runs",
        "schedule": float(config.env("EPOCHAL_RUN_WATCH_INTERVAL_S", "1")),
    },
    "autoscale": {
        "task": "epochal.autoscale",
        "schedule": float(config.env("EPOCHAL_AUTOSCALE_INTERVAL_S", "5")),
    },
    "collect-garbage": {
        "task": "epochal.collect_garbage",
        "schedule": float(config.env("EPOCHAL_GC_INTERVAL_S", "3600")),
    },
}
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")

# Epochal
EPOCHAL_OPERATION_LEASE_S = float(config.env("EPOCHAL_OPERATION_LEASE_S", "30"))
EPOCHAL_OPERATION_MAX_ATTEMPTS = int(config.env("EPOCHAL_OPERATION_MAX_ATTEMPTS", "3"))
EPOCHAL_RESTART_RESET_AFTER_S = float(config.env("EPOCHAL_RESTART_RESET_AFTER_S", "600"))
# A run the reconciler has not watched for this long shows `unknown (control plane was down)`.
EPOCHAL_UNWATCHED_AFTER_S = float(config.env("EPOCHAL_UNWATCHED_AFTER_S", "30"))
EPOCHAL_GC_RETENTION_DAYS = float(config.env("EPOCHAL_GC_RETENTION_DAYS", "7"))
EPOCHAL_STORE_URL = config.store_url()
EPOCHAL_STORE_ROOTS = config.store_roots()
# Where registered sinks may write: directories (Delta tables) and hosts (docs/sinks.md).
EPOCHAL_SINK_ROOTS = config.store_roots("EPOCHAL_SINK_ROOTS")
#: where the control plane is served, for links people follow (the Spark UI proxy's)
EPOCHAL_URL = config.env("EPOCHAL_URL", "http://127.0.0.1:8000")
#: the address Spark binds when set; a driver reporting its UI there is local
SPARK_LOCAL_IP = config.env("SPARK_LOCAL_IP", "")
EPOCHAL_SINK_HOSTS = config.sink_hosts()
EPOCHAL_RUNNER = config.runner()
EPOCHAL_SPARK_MASTER = config.spark_master()

# REST API (controlplane/api, docs/api.md)
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        # Token first: its WWW-Authenticate header makes anonymous requests 401, not 403.
        "controlplane.api.authentication.ApiTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["controlplane.api.permissions.HasRole"],
    "DEFAULT_PARSER_CLASSES": ["controlplane.api.parsers.StrictJSONParser"],
    "DEFAULT_RENDERER_CLASSES": [
        "controlplane.api.renderers.FastJSONRenderer",  # DRF's JSONRenderer with orjson
        "rest_framework.renderers.BrowsableAPIRenderer",
    ],
    "EXCEPTION_HANDLER": "controlplane.api.errors.exception_handler",
    "DEFAULT_SCHEMA_CLASS": "controlplane.api.schema.ApiAutoSchema",
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Epochal API",
    "DESCRIPTION": "Jobs, operations, snapshot lineage and audit of the Epochal control plane. "
    "See docs/api.md.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SERVE_PERMISSIONS": ["controlplane.api.permissions.IsViewer"],
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    "SCHEMA_PATH_PREFIX": "/api/",
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "controlplane.api.schema.strict_request_bodies",
        "controlplane.api.schema.operation_request_bodies",
        "controlplane.api.schema.exact_parameters",
        "controlplane.api.schema.response_links",
        "controlplane.api.schema.valid_defaults",
    ],
    "ENUM_NAME_OVERRIDES": {
        "JobStateEnum": "controlplane.jobs.models.JobState",
        "RunPhaseEnum": "controlplane.jobs.models.RunPhase",
        "OperationStateEnum": "controlplane.operations.models.OperationState",
        "OperationKindEnum": "controlplane.operations.models.OperationKind",
        "CommitKindEnum": "controlplane.lineage.models.COMMIT_KINDS",
        "TokenStateEnum": "controlplane.accounts.models.TOKEN_STATES",
    },
}
# Watches (?watch=S on job, operation, log and lineage reads): the longest wait, and how many
# may wait at once per server process (each holds one of the server's Python threads; see
# docs/api.md).
EPOCHAL_WATCH_MAX_S = float(config.env("EPOCHAL_WATCH_MAX_S", "60"))
EPOCHAL_WATCH_SLOTS = int(config.env("EPOCHAL_WATCH_SLOTS", "24"))
# Rendered answers of conditional reads kept per server process by ETag, at most this many
# bytes (controlplane/api/response_cache.py; 0: off).
EPOCHAL_RESPONSE_CACHE_BYTES = config.env_int("EPOCHAL_RESPONSE_CACHE_BYTES", 16 * 1024 * 1024)
# Pages whose JSON PostgreSQL builds (lineage graph, log; controlplane/api/prerendered.py);
# false renders them in Python as on SQLite (same bytes, more server CPU).
EPOCHAL_PRERENDERED_JSON = config.env_bool("EPOCHAL_PRERENDERED_JSON", True)
EPOCHAL_AUDIT_READS = config.env_bool("EPOCHAL_AUDIT_READS", False)
EPOCHAL_API_RATE = config.env("EPOCHAL_API_RATE", "100000/hour")
# Requests per client address (behind EPOCHAL_TRUSTED_PROXIES), anonymous ones included; off
# by default: without trusted proxies every client behind an Ingress shares its address.
EPOCHAL_API_ADDRESS_RATE = config.env("EPOCHAL_API_ADDRESS_RATE", "")
EPOCHAL_METRICS_TOKEN = config.env("EPOCHAL_METRICS_TOKEN", "")
EPOCHAL_METRICS_COMMIT_WINDOW = int(config.env("EPOCHAL_METRICS_COMMIT_WINDOW", "500"))
# Dashboard: a running job with input waiting and no commit for this long shows an alarm.
# The demo's brokers (`manage.py demo`), as the test suite and bin/services name them.
EPOCHAL_DEMO_RABBITMQ_STREAM_URL = config.env(
    "RABBITMQ_STREAM_URL", "rabbitmq-stream://guest:guest@127.0.0.1:5552/%2F"
)
EPOCHAL_DEMO_KAFKA_BOOTSTRAP_SERVERS = config.env("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092")
# A running job with input waiting and no commit for this long raises an alarm.
EPOCHAL_STALL_AFTER_S = float(config.env("EPOCHAL_STALL_AFTER_S", "120"))
# A downstream job more than this many upstream epochs behind raises the web's lag alarm.
EPOCHAL_WEB_LAG_ALARM_EPOCHS = config.env_int("EPOCHAL_WEB_LAG_ALARM_EPOCHS", 3)
# Fault injection for tests only (`controlplane.operations.executor`): never set in production.
EPOCHAL_OPERATION_CRASH_AT = config.env("EPOCHAL_OPERATION_CRASH_AT", "")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": config.env("LOG_LEVEL", "INFO")},
    "loggers": {
        "django.db.backends": {"level": "WARNING"},
        # The filesystem broker has no host; kombu warns about that on every connection.
        "kombu.connection": {"level": "ERROR"},
    },
}
