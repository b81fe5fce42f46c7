"""Every relative link of README.md and docs/*.md reaches a file of the tree, and its anchor (when it
has one) a heading of that page, so that moving a section cannot leave a link behind.

The contracts the code, tests and docs rely on live in docs/, in our words, and are cited by their path
there (`docs/hints.md#sender-suppression`): every such citation reaches a page and a heading of the tree,
a page named alone (`scaling.md`) is one of the tree's, and nothing cites a file outside the repository.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```.*?^```$", flags=re.DOTALL | re.MULTILINE)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
# Where citations are looked for: the product, its development packages and every page.
CITING_FOLDERS = ("app", "workers", "fakes", "tests", "bench", "alembic", "deploy", "docs", ".ci")
CITING_FILES = (
    "README.md",
    "ARCHITECTURE.md",
    "Makefile",
    "pyproject.toml",
    "Dockerfile",
    "docker-compose.yml",
)
TEXT = {".py", ".md", ".toml", ".yml", ".yaml", ".sql", ".proto", ".json", ".txt", ""}
CITED_PAGE = re.compile(r"(?<![\w/.-])docs/[\w/.-]+?\.md(?:#[\w-]+)?")
PAGE_ALONE = re.compile(r"(?<![\w/.-])[\w-]+\.md\b")
# A folder beside the repository, or the specifications it was built from (spelled so as not to match here).
OUTSIDE = re.compile(r"\.\./+(?:shared|seeds|vectors)\b|\bshared[/]spec\b")


def anchor(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    return {anchor(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", text, flags=re.MULTILINE)}


def relative_links(page: Path) -> list[str]:
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    text = re.sub(r"`[^`\n]*`", "", text)  # code spans: `](` inside one is no link
    return [target for target in LINK.findall(text) if not re.match(r"^[a-z]+:", target)]


def test_the_readme_stays_short() -> None:
    assert len((ROOT / "README.md").read_text(encoding="utf-8").splitlines()) <= 300


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for target in relative_links(page):
        path, _, fragment = target.partition("#")
        destination = (page.parent / path).resolve() if path else page
        if not destination.exists():
            broken.append(f"{target}: no such file")
        elif fragment and (destination.suffix != ".md" or fragment not in anchors(destination)):
            broken.append(f"{target}: no such heading")
    assert not broken, f"{page.relative_to(ROOT)}: {broken}"


def citing_files() -> list[Path]:
    files = [ROOT / name for name in CITING_FILES]
    for folder in CITING_FOLDERS:
        files += (
            path
            for path in (ROOT / folder).rglob("*")
            if path.is_file() and path.suffix in TEXT and "__pycache__" not in path.parts
        )
    return sorted(files)


def cited_pages(text: str) -> list[str]:
    return CITED_PAGE.findall(text)


def pages_alone(text: str) -> list[str]:
    return PAGE_ALONE.findall(text)


def outside_citations(text: str) -> list[str]:
    return OUTSIDE.findall(text)


def test_the_finders_find_every_form_of_citation() -> None:
    text = """
    Contract: docs/hints.md#sender-suppression, docs/api.md and (docs/upstream/aioapns.md).
    # see scaling.md; ../performance.md is a link; not a page: mydocs/x.md, hints.mdx
    the old ones: ..[/]shared[/]spec/pipeline.md, ../..[/]seeds/004.txt, and shared[/]spec itself
    """.replace("[/]", "/")
    assert cited_pages(text) == [
        "docs/hints.md#sender-suppression",
        "docs/api.md",
        "docs/upstream/aioapns.md",
    ]
    assert pages_alone(text) == ["scaling.md"]
    assert len(outside_citations(text)) == 3


def test_every_cited_page_and_heading_is_in_the_tree() -> None:
    broken = []
    pages = {path.name for path in [*ROOT.glob("*.md"), *(ROOT / "docs").rglob("*.md")]}
    for path in citing_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        where = str(path.relative_to(ROOT))
        for citation in cited_pages(text):
            page, _, fragment = citation.partition("#")
            if not (ROOT / page).is_file():
                broken.append(f"{where}: {citation}: no such page")
            elif fragment and fragment not in anchors(ROOT / page):
                broken.append(f"{where}: {citation}: no such heading")
        broken += (f"{where}: {name}: no page of the tree" for name in pages_alone(text) if name not in pages)
    assert len(citing_files()) >= 200  # the tree was found
    assert broken == []


def test_nothing_cites_a_file_outside_the_repository() -> None:
    found = {
        str(path.relative_to(ROOT)): citations
        for path in citing_files()
        if (citations := outside_citations(path.read_text(encoding="utf-8", errors="replace")))
    }
    assert found == {}, "cite the page of docs/ that holds the contract, in our words"
