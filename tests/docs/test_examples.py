"""Every shell example in README.md and docs/ runs (tests/docs/blocks.py: the convention).

The blocks of one document run in order in one shell state (variables carry over from block
to block, as in a reader's terminal) against the demo control plane of conftest.py, from the
repository's root. `curl` fails on an HTTP error status, and every block runs with
`set -euo pipefail`: an example that errors fails the test naming its file and line."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.docs.blocks import ROOT, blocks, convention_errors, documents
from tests.docs.conftest import DocsPlane

#: run before every block: fail on errors, curl fails on 4xx/5xx, the shell state so far
PRELUDE = """set -a
source "$EPOCHAL_DOCS_STATE"
set -euo pipefail
curl() { command curl --silent --show-error --fail-with-body "$@"; }
"""
#: after every block: keep its variables for the next block of the document
EPILOGUE = '\nexport -p > "$EPOCHAL_DOCS_STATE"\n'


def test_every_block_follows_the_convention() -> None:
    errors = [
        f"{block.where}: {error}"
        for path in documents()
        for block in blocks(path)
        for error in convention_errors(block)
    ]
    assert errors == [], "\n".join(errors)


def _runnable(path: Path) -> bool:
    return any(block.runs for block in blocks(path))


@pytest.mark.spark
@pytest.mark.parametrize(
    "document",
    [p for p in documents() if _runnable(p)],
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_shell_examples_run(document: Path, docs_plane: DocsPlane, tmp_path: Path) -> None:
    state = tmp_path / "state.sh"
    state.write_text("")
    env = {**docs_plane.env, "EPOCHAL_DOCS_STATE": str(state)}
    for block in blocks(document):
        if not block.runs:
            continue
        done = subprocess.run(
            ["bash", "-c", PRELUDE + block.code + EPILOGUE],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, (
            f"{block.where}: the example exited {done.returncode}\n{block.code}\n"
            f"--- stdout\n{done.stdout[-4000:]}\n--- stderr\n{done.stderr[-4000:]}"
        )
