"""Fenced code blocks of README.md and docs/*.md, and the convention that says which run.

* ```bash (or sh, shell): commands a reader types. tests/docs runs every one, in document
  order, against a demo control plane (see conftest.py).
* Any other info string (text, json, yaml, python, mermaid, …) is an illustration: output,
  a transcript (`$ command` then what it printed), a syntax summary, a file's contents. Not
  run. Commands a reader types do not belong there: a line starting with `curl `,
  `.venv/bin/` or `manage.py ` outside a transcript fails the test.
* A ```bash block that cannot run in a test (it serves forever, needs a Kubernetes cluster,
  takes minutes) is preceded by `<!-- not-run: reason -->` on the line just before the fence.
* A fence without an info string fails the test: say which kind of block it is.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHELL = {"bash", "sh", "shell"}
FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")
NOT_RUN = re.compile(r"^\s*<!--\s*not-run:\s*(?P<reason>.*?)\s*-->\s*$")
COMMAND = re.compile(r"^\s*(curl |\.venv/bin/|manage\.py |python manage\.py )")


@dataclass(frozen=True)
class Block:
    path: str  # relative to the repository
    line: int  # of the opening fence, 1-based
    info: str  # the info string's first word ("" when none)
    code: str
    not_run: str | None  # the reason, when marked

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"

    @property
    def runs(self) -> bool:
        return self.info in SHELL and self.not_run is None


def documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def blocks(path: Path) -> list[Block]:
    lines = path.read_text().splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        fence = opening["fence"]
        end = i + 1
        while end < len(lines) and not lines[end].strip().startswith(fence):
            end += 1
        previous = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        marker = NOT_RUN.match(previous)
        indent = len(opening["indent"])
        code = "\n".join(line[indent:] for line in lines[i + 1 : end])
        info = opening["info"].strip().split(" ")[0] if opening["info"].strip() else ""
        found.append(
            Block(
                path=str(path.relative_to(ROOT)),
                line=i + 1,
                info=info,
                code=code,
                not_run=marker["reason"] if marker else None,
            )
        )
        i = end + 1
    return found


def convention_errors(block: Block) -> list[str]:
    """What is wrong with a block under the convention above (empty: nothing)."""
    errors = []
    if not block.info:
        errors.append("a fence without an info string: ```bash (run) or ```text (not run)")
    if block.not_run is not None and not block.not_run:
        errors.append("<!-- not-run: --> without a reason")
    if block.not_run is not None and block.info not in SHELL:
        errors.append(f"<!-- not-run --> on a ```{block.info} block, which never runs")
    if block.info and block.info not in SHELL:
        for line in block.code.splitlines():
            if COMMAND.match(line):
                errors.append(
                    f"command {line.strip()!r} in a ```{block.info} block: commands go in "
                    "```bash blocks (or transcripts, `$ command`)"
                )
    return errors
