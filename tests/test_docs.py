"""The docs hold together: every relative link and anchor in README.md and docs/ resolves, every
``docs/*.md`` the code or the docs name exists, docs/index.md lists every page, and no two pages
say the same thing twice.

Anchors follow GitHub's slugs: the heading's text lowercased, markup and punctuation other than
``-`` and ``_`` dropped, spaces turned to ``-``; a repeated slug gets ``-1``, ``-2``, ...
External (http) links are not checked.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]

FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", flags=re.M | re.S)
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t]*#*[ \t]*$", flags=re.M)

# Two pages are near-duplicates when they share more than SHARED_RUNS distinct runs of RUN words
# (one sentence of ~20 words repeated word for word is 12 runs). Measured before the merge of
# issue 42: simulator / simulator-guide 50, architecture / architecture-overview 27, ray /
# ray-overview 15, demo / demo-bench 15; every other pair of pages after it: 12 at most.
RUN = 8
SHARED_RUNS = 12


def prose(text: str) -> str:
    """The text outside fenced code blocks and inline code."""
    text = FENCE.sub("", text)
    return re.sub(r"`[^`\n]*`", "", text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor GitHub makes for the headings of a markdown file."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    for heading in HEADING.findall(FENCE.sub("", path.read_text())):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(path: Path) -> list[str]:
    """The relative targets of a page's links (external ones left out)."""
    text = FENCE.sub("", path.read_text())
    text = re.sub(r"(`+)[^`\n]*?\1", "", text)  # a link inside inline code is not a link
    return [t for t in LINK.findall(text) if not re.match(r"[a-z][a-z0-9+.-]*:", t, flags=re.I)]


def test_slugs_follow_github() -> None:
    assert slug("The first five minutes") == "the-first-five-minutes"
    assert slug("Agents over HTTP: the OpenAI-compatible gateway") == (
        "agents-over-http-the-openai-compatible-gateway"
    )
    assert slug("The paper-scale simulator (`pearl simulate`, `pearl/sim/`)") == (
        "the-paper-scale-simulator-pearl-simulate-pearlsim"
    )
    assert slug("End-to-end comparison (§6.2, Figure 5)") == "end-to-end-comparison-62-figure-5"
    assert slug("Eq. 1–3 and [the log](x.md)") == "eq-13-and-the-log"


def test_a_broken_link_is_found(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text("# Top\n## Top\n```\n# not a heading\n```\n")
    page = tmp_path / "b.md"
    page.write_text("[x](a.md#top-1) [y](a.md#not-a-heading) `[z](gone.md)` [w](gone.md)\n")
    assert anchors(tmp_path / "a.md") == {"top", "top-1"}
    assert links(page) == ["a.md#top-1", "a.md#not-a-heading", "gone.md"]
    assert broken(page) == ["a.md#not-a-heading", "gone.md"]


def broken(page: Path) -> list[str]:
    out = []
    for target in links(page):
        file, _, anchor = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        if not dest.exists() or (anchor and dest.suffix == ".md" and anchor not in anchors(dest)):
            out.append(target)
    return out


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_and_anchors_resolve(page: Path) -> None:
    bad = broken(page)
    assert not bad, f"{page.relative_to(ROOT)}: links to nothing: {bad}"


def test_docs_named_anywhere_exist() -> None:
    """A ``docs/NAME.md`` named in prose, a docstring or a comment is a page that exists (a path
    inside another site's URL is that site's)."""
    missing = []
    for folder in ("pearl", "actors", "transports", "tests", "benchmarks", "examples", "configs"):
        for path in sorted((ROOT / folder).rglob("*")):
            if path == Path(__file__).resolve():
                continue
            if path.suffix not in {".py", ".toml", ".md"} or not path.is_file():
                continue
            for name in re.findall(r"(?<![\w/.-])docs/[\w/.-]+?\.md\b", path.read_text()):
                if not (ROOT / name).exists():
                    missing.append(f"{path.relative_to(ROOT)}: {name}")
    for page in PAGES:
        for name in re.findall(r"(?<![\w/.-])docs/[\w/.-]+?\.md\b", page.read_text()):
            if not (ROOT / name).exists() and not (page.parent / name).exists():
                missing.append(f"{page.relative_to(ROOT)}: {name}")
    assert not missing, f"names of docs that do not exist: {missing}"


def test_the_index_lists_every_page() -> None:
    index = DOCS / "index.md"
    listed = {(DOCS / t.partition("#")[0]).resolve() for t in links(index)}
    pages = {p.resolve() for p in DOCS.rglob("*.md")} - {index.resolve()}
    assert not pages - listed, f"docs/index.md omits {sorted(str(p) for p in pages - listed)}"
    assert "docs/index.md" in (ROOT / "README.md").read_text()


def runs(path: Path) -> set[tuple[str, ...]]:
    text = re.sub(r"\]\([^)]*\)", "]", path.read_text())  # a link's target is not its prose
    words = re.findall(r"[a-z0-9_.]+", text.lower())
    return {tuple(words[i : i + RUN]) for i in range(len(words) - RUN + 1)}


def shared_runs(pages: list[Path]) -> list[tuple[int, str, str]]:
    """Pairs of pages that share more than SHARED_RUNS runs of RUN words, most shared first."""
    text = {p: runs(p) for p in pages}
    pairs = [(len(text[a] & text[b]), a, b) for a, b in itertools.combinations(pages, 2)]
    name = lambda p: str(p.relative_to(DOCS))  # noqa: E731
    return sorted(((n, name(a), name(b)) for n, a, b in pairs if n > SHARED_RUNS), reverse=True)


def test_no_two_pages_repeat_each_other() -> None:
    dup = shared_runs(sorted(DOCS.rglob("*.md")))
    assert not dup, f"pages that repeat each other (shared {RUN}-word runs, page, page): {dup}"
