"""The security tests reuse the API tests' fixtures: users of each role with tokens, a real
store with a small indexed lineage, an application version and a job; and a deployment served
by the web server as the chart runs it (`tests.security.deployed`)."""

from tests.api.conftest import (  # noqa: F401  (fixtures)
    client_for,
    fast_password_hashing,
    lineage,
    store_url,
    tokens,
)
from tests.security.attacks import listener, worker, worker_env  # noqa: F401  (fixtures)
from tests.security.deployed import deployment  # noqa: F401  (fixture)
