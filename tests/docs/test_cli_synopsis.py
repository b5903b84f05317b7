"""docs/control-plane.md's CLI synopsis names every verb `epochal --help` lists, and no other."""

from __future__ import annotations

import re
from pathlib import Path

from controlplane.cli.main import build_parser

ROOT = Path(__file__).resolve().parents[2]


def test_the_synopsis_names_every_verb() -> None:
    text = (ROOT / "docs" / "control-plane.md").read_text()
    cli = text[text.index("## CLI") :]
    synopsis = cli[cli.index("```text") : cli.index("```", cli.index("```text") + 7)]
    documented = set(re.findall(r"^epochal ([a-z-]+)", synopsis, re.M))
    [verbs] = [a for a in build_parser()._actions if a.dest == "verb"]
    assert documented == set(verbs.choices)
