"""The repository stands alone: every link in its Markdown resolves to a file inside it, and no
file refers to something a reader of the repository cannot follow (a path outside it, a
research note, an internal ticket). Papers are cited by author and title."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TEXT = {".py", ".md", ".html", ".txt", ".yaml", ".yml", ".toml", ".sh", ".cfg", ".js", ".css"}
SKIP = {".venv", "var", ".git", "node_modules", "__pycache__", ".mypy_cache", ".ruff_cache"}
OUTSIDE = re.compile(
    r"\.\./shared|/work/|\bseeds?[ _]?0\d\d\b|\bseeds/|\bissue #?\d+\b",
    re.IGNORECASE,
)
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _files() -> list[Path]:
    try:
        listed = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        paths = [ROOT / name for name in listed]
    except (OSError, subprocess.CalledProcessError):  # not a git checkout
        paths = [p for p in ROOT.rglob("*") if not SKIP & set(p.relative_to(ROOT).parts)]
    return [
        p
        for p in paths
        if p.is_file() and (p.suffix in TEXT or p.parent.name == "bin") and p != Path(__file__)
    ]


def test_no_file_refers_outside_the_repository() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()[:120]}"
        for path in _files()
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), start=1)
        if OUTSIDE.search(line)
    ]
    assert not found, "references a reader cannot follow (cite by author and title):\n" + (
        "\n".join(found)
    )


def test_every_markdown_link_resolves_inside_the_repository() -> None:
    broken = []
    for path in _files():
        if path.suffix != ".md":
            continue
        for target in LINK.findall(path.read_text()):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue  # a web address or an anchor on the same page
            resolved = (path.parent / target.split("#")[0]).resolve()
            if not resolved.is_relative_to(ROOT) or not resolved.exists():
                broken.append(f"{path.relative_to(ROOT)}: {target}")
    assert not broken, "links that do not resolve inside the repository:\n" + "\n".join(broken)


def test_the_checks_see_an_outside_reference() -> None:
    for bad in ("see ../shared/design/X.md", "per seed 003 §4", "as in issue 7"):
        assert OUTSIDE.search(bad), bad
    for fine in ("murmur3_x86_32 (seed 0, unsigned)", "an issue with 3 fields"):
        assert not OUTSIDE.search(fine), fine


REMOTE_ASSET = re.compile(r"<(?:script|link|img)\b[^>]*\b(?:src|href)=[\"']?(?:https?:)?//", re.I)


def test_no_page_in_the_repository_loads_a_script_or_style_from_the_network() -> None:
    remote = [
        f"{path.relative_to(ROOT)}: {match.group(0)[:120]}"
        for path in _files()
        if path.suffix == ".html"
        for match in REMOTE_ASSET.finditer(path.read_text(errors="replace"))
    ]
    assert not remote, "pages that would download at view time:\n" + "\n".join(remote)


def test_the_remote_asset_check_sees_a_cdn_script() -> None:
    assert REMOTE_ASSET.search('<script charset="utf-8" src="https://cdn.plot.ly/plotly.min.js">')
    assert REMOTE_ASSET.search("<link rel=stylesheet href=//fonts.example.com/a.css>")
    assert not REMOTE_ASSET.search("<script src=\"{% static 'web/vendor/plotly.min.js' %}\">")
    assert not REMOTE_ASSET.search("<script>var u = 'https://cdn.plot.ly/un/';</script>")
