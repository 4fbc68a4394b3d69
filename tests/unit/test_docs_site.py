"""The docs site: a README that is a front door, pages that all build, links that resolve.

The python blocks of every page run in ``test_readme_examples.py`` (unit and integration);
this checks the rest: size, links, the nav, and ``mkdocs build --strict`` itself.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.rglob("*.md"))
README_MAX_BYTES = 15 * 1024

_LINK = re.compile(r"\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^(```|~~~)")


def _prose(path: Path) -> str:
    """The page without its code blocks (a ``](x)`` in code is not a link)."""
    kept, fenced = [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        if _FENCE.match(line.strip()):
            fenced = not fenced
            continue
        if not fenced:
            kept.append(line)
    return "\n".join(kept)


def _slug(heading: str) -> str:
    """The anchor MkDocs (Python-Markdown's toc) gives a heading."""
    text = re.sub(r"`", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return re.sub(r"[\s]+", "-", text).strip("-")


def _anchors(path: Path) -> set[str]:
    return {_slug(m) for m in re.findall(r"^#+ (.+)$", _prose(path), re.M)}


def _nav_pages(nav: object) -> list[str]:
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, list):
        return [page for item in nav for page in _nav_pages(item)]
    if isinstance(nav, dict):
        return [page for value in nav.values() for page in _nav_pages(value)]
    return []


def test_the_readme_is_a_front_door() -> None:
    size = len((ROOT / "README.md").read_bytes())
    assert size <= README_MAX_BYTES, f"README.md is {size} bytes; move detail into docs/"


@pytest.mark.parametrize(
    "page", [ROOT / "README.md", *PAGES], ids=lambda p: str(p.relative_to(ROOT))
)
def test_every_relative_link_resolves(page: Path) -> None:
    for target in _LINK.findall(_prose(page)):
        if re.match(r"^[a-z]+:", target):
            continue  # http:, https:, mailto:
        file, _, anchor = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        assert dest.exists(), f"{page.relative_to(ROOT)}: {target} does not exist"
        if anchor and dest.suffix == ".md":
            assert anchor in _anchors(dest), f"{page.relative_to(ROOT)}: no #{anchor} in {file}"


def test_every_page_is_in_the_nav_and_every_nav_entry_exists() -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    nav = _nav_pages(config["nav"])
    pages = {str(p.relative_to(DOCS)) for p in PAGES}
    assert set(nav) == pages, (sorted(pages - set(nav)), sorted(set(nav) - pages))


def test_the_snippets_the_pages_include_exist() -> None:
    readme = (ROOT / "README.md").read_text()
    for page in PAGES:
        for file, section in re.findall(r'^--8<-- "([^":]+):?(\w*)"', page.read_text(), re.M):
            assert (ROOT / file).exists(), f"{page}: {file}"
            if section:
                assert f"[start:{section}]" in readme and f"[end:{section}]" in readme


def _needs(module: str) -> None:
    if importlib.util.find_spec(module) is None:
        if os.environ.get("CI"):
            pytest.fail(f"{module} is not installed: bash scripts/setup.sh --test installs .[docs]")
        pytest.skip(f"{module} is not installed (pip install -e '.[docs]')")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built once per module (about 3 s) by ``mkdocs build --strict``."""
    _needs("mkdocs")
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def _html(site: Path, page: str) -> str:
    return (site / page / "index.html").read_text(encoding="utf-8")


def _text(html: str) -> str:
    return re.sub(r"<[^>]+>", "", html)


def test_the_site_builds_strict(site: Path) -> None:
    assert (site / "reference" / "api" / "index.html").exists()
    assert "no such address" in _html(site, "quickstart")  # the README's quick start, included


# -- the API reference: by role, every name once, docstrings read as Markdown --------------

API = DOCS / "reference" / "api.md"
ROLES = ["publish", "consume", "topology", "stores", "testing", "spark", "frameworks", "errors"]


def test_the_api_reference_goes_by_role() -> None:
    headings = [
        h.split(":")[0].strip().lower() for h in re.findall(r"^## (.+)$", API.read_text(), re.M)
    ]
    assert headings == ROLES
    targets = re.findall(r"^::: (\S+)$", API.read_text(), re.M)
    assert targets[0] == "delayq.Publisher", "the page starts with what you publish with"


def test_every_name_of_delayq_is_in_the_api_reference_once() -> None:
    import delayq
    from delayq.errors import DelayqError

    targets = re.findall(r"^::: (\S+)$", API.read_text(), re.M)
    assert len(targets) == len(set(targets)), "a name documented twice"
    documented = {t.removeprefix("delayq.") for t in targets}
    errors = {
        n
        for n in delayq.__all__
        if isinstance(getattr(delayq, n, None), type)
        and issubclass(getattr(delayq, n), DelayqError)
    }
    missing = sorted(set(delayq.__all__) - errors - documented)
    assert not missing, f"not in docs/reference/api.md: {missing}"
    assert "::: delayq.errors" in (DOCS / "reference" / "errors.md").read_text()  # the errors


def test_the_built_api_reference_goes_by_role(site: Path) -> None:
    html = _html(site, "reference/api")
    sections = re.findall(r'<h2 id="([^"]+)"', html)
    assert [s.split("-")[0] for s in sections] == ROLES
    objects = re.findall(r'<h3 id="([^"]+)"', html)
    first = {
        role: objects.index(name)
        for role, name in [
            ("publish", "delayq.Publisher"),
            ("consume", "delayq.Consumer"),
            ("topology", "delayq.Topology"),
            ("stores", "delayq.IdempotencyStore"),
            ("testing", "delayq.testing.MemoryBroker"),
            ("spark", "delayq.spark.ScheduleSummary"),
        ]
    }
    assert list(first.values()) == sorted(first.values()), first
    assert objects[0] == "delayq.Publisher"


@pytest.mark.parametrize("cls", ["Publisher", "AsyncPublisher", "Consumer", "Worker"])
def test_a_class_members_are_in_the_order_of_its_source_not_alphabetical(
    site: Path, cls: str
) -> None:
    import inspect

    import delayq

    target = getattr(delayq, cls)
    html = _html(site, "reference/api")
    shown = re.findall(rf'id="delayq\.{cls}\.([a-z][a-z_]*)"', html)
    methods = [n for n in shown if inspect.isfunction(inspect.getattr_static(target, n, None))]
    line = {n: inspect.getsourcelines(getattr(target, n))[1] for n in methods}
    assert len(methods) >= 3, shown
    assert methods == sorted(methods, key=line.__getitem__), "members not in source order"
    assert methods != sorted(methods), "alphabetical order (members_order: source in mkdocs.yml)"


@pytest.mark.parametrize("page", ["reference/api", "reference/errors"])
def test_docstring_examples_render_as_code(site: Path, page: str) -> None:
    html = _html(site, page)
    assert "doctest:" not in html, "a doctest flag shown (docs/griffe_docstrings.py)"
    outside_code = re.sub(r"<pre\b.*?</pre>", "", html, flags=re.S)
    assert "&gt;&gt;&gt;" not in outside_code, "a >>> example outside a code block"
    assert "<blockquote" not in outside_code
    for role in (":class:", ":meth:", ":func:", ":mod:", ":attr:", ":data:"):
        assert role not in html, f"a Sphinx role shown as text: {role}"
    if page == "reference/api":  # the examples are there, highlighted as a console session
        assert '<span class="gp">&gt;&gt;&gt; </span>' in html


def _griffe_docstrings() -> ModuleType:
    _needs("griffe")
    spec = importlib.util.spec_from_file_location(
        "griffe_docstrings", DOCS / "griffe_docstrings.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_doctest_block_becomes_a_pycon_block_without_its_flags() -> None:
    as_markdown = _griffe_docstrings().as_markdown
    text = (
        "Publishes.\n\n"
        ">>> with Publisher(url) as pub:  # doctest: +SKIP\n"
        "...     pub.publish({}, 'k', '1m')   # the receipt  # doctest: +SKIP, +ELLIPSIS\n"
        "Receipt(...)\n\n"
        "See :class:`~delayq.Receipt`, :meth:`Publisher.close` and\n"
        ":meth:`Consumer.run\n<delayq.sync.Consumer.run>` (a role on two lines)."
    )
    assert as_markdown(text) == (
        "Publishes.\n\n"
        "```pycon\n"
        ">>> with Publisher(url) as pub:\n"
        "...     pub.publish({}, 'k', '1m')   # the receipt\n"
        "Receipt(...)\n"
        "```\n\n"
        "See `Receipt`, `Publisher.close` and\n"
        "`Consumer.run` (a role on two lines)."
    )


def test_a_literal_block_becomes_a_fenced_block() -> None:
    as_markdown = _griffe_docstrings().as_markdown
    text = "Its url works wherever a URL does::\n\n    broker = MemoryBroker()\n      x\n\nAfter."
    assert as_markdown(text) == (
        "Its url works wherever a URL does:\n\n```\nbroker = MemoryBroker()\n  x\n```\n\nAfter."
    )
    plain = "No example here: `code`, **bold**, a list:\n\n- one\n- two"
    assert as_markdown(plain) == plain


# -- the pages a first reader starts with ----------------------------------------------------


def test_wide_code_blocks_scroll_with_a_visible_scrollbar(site: Path) -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    assert "stylesheets/extra.css" in config["extra_css"]
    css = (DOCS / "stylesheets" / "extra.css").read_text()
    rule = re.search(r"\.md-typeset pre > code \{(.*?)\}", css, re.S)
    assert rule and "overflow-x: auto" in rule.group(1)
    assert re.search(r"::-webkit-scrollbar \{\s*height: 0\.[5-9]rem", css)
    assert "stylesheets/extra.css" in _html(site, "project/performance")


def _section(name: str) -> str:
    readme = (ROOT / "README.md").read_text()
    found = re.search(rf"\[start:{name}\] -->\n(.*?)<!-- --8<-- \[end:{name}\]", readme, re.S)
    assert found, name
    return found.group(1)


def test_the_readme_sections_the_site_includes_link_the_site_way() -> None:
    """A README section a page includes is read from docs/: an inline ``docs/`` link or a
    bare path would be broken or plain text there. Reference links work in both places,
    each page defining the targets for itself."""
    for page in PAGES:
        text = page.read_text()
        for section in re.findall(r'^--8<-- "README\.md:(\w+)"', text, re.M):
            body = _section(section)
            prose = "\n".join(
                line for line in body.splitlines() if not line.startswith(("    ", "```"))
            )
            assert "](docs/" not in prose, f"README:{section} has an inline docs/ link"
            bare = re.findall(r"(?<![(\[/])\bdocs/[\w/.-]+\.md\b", re.sub(r"`[^`]*`", "", prose))
            assert not bare, f"README:{section}: plain-text paths {bare}"
            for ref in re.findall(r"\]\[([^\]]+)\]", prose):
                assert re.search(rf"^\[{re.escape(ref)}\]: \S+", text, re.M), (
                    f"{page.relative_to(ROOT)} includes README:{section}; no [{ref}]: there"
                )
    for ref, target in re.findall(r"^\[([^\]]+)\]: (\S+)$", (ROOT / "README.md").read_text(), re.M):
        assert (ROOT / target).exists(), f"README: [{ref}]: {target} does not exist"
    for page in PAGES:
        for ref, target in re.findall(r"^\[([^\]]+)\]: (\S+)$", page.read_text(), re.M):
            if not re.match(r"^[a-z]+:", target):
                assert (page.parent / target).exists(), f"{page}: [{ref}]: {target}"


def test_the_home_page_links_the_performance_page(site: Path) -> None:
    home = _html(site, "")
    assert "docs/project/performance.md" not in home
    assert re.search(r'<a href="project/performance/">performance</a>', home)


def test_the_quick_start_shows_the_two_commands_once(site: Path) -> None:
    html = _html(site, "quickstart")
    headings = [_text(h) for h in re.findall(r"<h[1-6][^>]*>(.*?)</h[1-6]>", html, re.S)]
    assert sum("two commands" in h.lower() for h in headings) == 1, headings
    assert _text(html).count("bash scripts/demo.sh") == 1
    assert _text(html).count("bash scripts/test.sh") == 1


def test_the_local_servers_are_imported_from_delayq_local() -> None:
    from delayq.local import LocalCluster, LocalNode, NodeTLS

    assert [c.__name__ for c in (LocalCluster, LocalNode, NodeTLS)] == [
        "LocalCluster",
        "LocalNode",
        "NodeTLS",
    ]
    for page in [ROOT / "README.md", *PAGES]:
        text = page.read_text()
        old = re.findall(r"delayq\.local\.(?:node|cluster)\b(?:\.\w+| import \w+)", text)
        assert not old, f"{page.relative_to(ROOT)}: {old}: use `from delayq.local import ...`"


def test_the_async_adapter_is_described_as_it_is() -> None:
    """AsyncPublisher and AsyncConsumer speak AMQP through delayq's own client over pamqp
    (``delayq.aio._wire``); aio-pika only applies the topology (and serves the optional
    ``AioPikaLink`` / ``AioPikaFeed``). No page says the async adapter runs on aio-pika."""
    import delayq
    import delayq.aio

    wrong = [
        r"(?:AsyncPublisher|AsyncConsumer|delayq\.aio|aio/)`*\s*\(aio-pika\)",
        r"\(pika and aio-pika\)",
        r"pika's or aio-pika's",
    ]
    texts = {str(p.relative_to(ROOT)): p.read_text() for p in [ROOT / "README.md", *PAGES]}
    texts["delayq.__doc__"] = delayq.__doc__ or ""
    texts["delayq.aio.__doc__"] = delayq.aio.__doc__ or ""
    for where, text in texts.items():
        flat = re.sub(r"\s+", " ", text)
        for pattern in wrong:
            assert not re.search(pattern, flat), f"{where}: {re.findall(pattern, flat)}"
    assert "pamqp" in (delayq.__doc__ or "") and "pamqp" in (delayq.aio.__doc__ or "")
