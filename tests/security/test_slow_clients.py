"""Slow clients cannot freeze the web server as deployed (granian, the chart's command).

Connections without a token announcing a body over the limit, connections with and without
a token trickling bodies under it, and connections trickling their headers, all at once and
starting again as soon as they are answered: `/healthz` keeps answering within 100 ms, an
oversized body is refused at once without being read (and the connection closed), and the
server holds at most `EPOCHAL_BODY_SLOTS` of its threads for bodies — the rest answer 503 at
once. `bench/slow_clients.py` runs the same attack with 200 connections for a minute.
"""

from __future__ import annotations

import socket
import time

from bench.slow_clients import OVERSIZED_BYTES, run_attack
from tests.security.deployed import Deployment

CONNECTIONS = 64
THREADS = 8
BODY_SLOTS = 4


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def test_an_oversized_body_is_refused_at_once_unread_and_the_connection_closed(
    deployment: Deployment,
) -> None:
    with deployment.serve(threads=THREADS) as url:
        with socket.create_connection(("127.0.0.1", _port(url)), timeout=10) as conn:
            conn.sendall(
                b"POST /api/jobs/ HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                b"Content-Type: application/json\r\n"
                + f"Content-Length: {OVERSIZED_BYTES}\r\n\r\n{{".encode()
            )
            started = time.monotonic()
            answer = b""
            while True:
                chunk = conn.recv(65536)
                if not chunk:
                    break  # closed by the server: the rest of the body is never read
                answer += chunk
            assert time.monotonic() - started < 5
        assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
        assert b'"body_too_large"' in answer


def test_healthz_answers_within_100_ms_while_slow_clients_attack(deployment: Deployment) -> None:
    with deployment.serve(threads=THREADS, EPOCHAL_BODY_SLOTS=str(BODY_SLOTS)) as url:
        result = run_attack(
            "127.0.0.1",
            _port(url),
            deployment.tokens["operator"],
            connections=CONNECTIONS,
            seconds=8,
        )
    print(result)
    answers = result["attack_answers"]
    assert result["healthz_failed"] == 0, result
    assert result["healthz_p99_ms"] <= 100, result
    # oversized bodies: refused without being read, over and over
    assert answers.get("oversized:413", 0) >= CONNECTIONS // 4, result
    # bodies under the limit: at most the body slots are held, the others are turned away
    assert result["threads_held_max"] <= BODY_SLOTS, result
    assert answers.get("authenticated_body:503", 0) + answers.get("anonymous_body:503", 0) > 0
