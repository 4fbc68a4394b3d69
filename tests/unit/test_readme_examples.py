"""Every python block of the README (and docs/*.md) that needs no server runs as it is,
and every test marker before a block is well formed (see ``tests/readme_examples.py``).
Blocks that need a broker or another server run in ``tests/integration``."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import readme_examples as rx


def test_the_markers_are_well_formed() -> None:
    rx.all_blocks()  # raises MarkerError naming the line of the first bad marker


def test_every_block_runs_or_says_why_not() -> None:
    blocks = rx.all_blocks()
    assert len(blocks) >= 20, "the README's python blocks were not found"
    unit = {b.where for b in rx.runnable(server=False)}
    integration = {b.where for b in rx.runnable(server=True)}
    skipped = {b.where: b.skip for b in blocks if b.skip is not None}
    assert unit | integration | set(skipped) == {b.where for b in blocks}
    assert not unit & integration
    assert all(skipped.values())


@pytest.mark.parametrize(
    "marker",
    [
        "<!-- test: skip -->",
        "<!-- test: skip () -->",
        "<!-- test: skip (   ) -->",
        "<!-- test: skip because -->",
        "<!-- test: skip (reason); runs until stopped -->",
        "<!-- test: continue previous -->",
        "<!-- test: needs rabbit -->",
        "<!-- test: needs -->",
        "<!-- test: runs until stopped; -->",
    ],
)
def test_a_bad_marker_is_refused(
    marker: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(rx, "ROOT", tmp_path)
    doc = tmp_path / "DOC.md"
    doc.write_text(f"```python\nx = 1\n```\n\n{marker}\n```python\nprint(x)\n```\n")
    with pytest.raises(rx.MarkerError, match=r"DOC\.md:5"):
        rx.parse(doc)


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("<!-- test: skip (why) -->\n```sh\nls\n```\n", 1),  # before a shell block
        ("<!-- test: skip (why) -->\ntext\n```python\nx = 1\n```\n", 1),  # not right before
        ("<!-- test: continues previous -->\n```python\nx = 1\n```\n", 1),  # nothing before
        ("text\n<!-- test: skip (why) -->\n", 2),  # no block at all
    ],
)
def test_a_misplaced_marker_is_refused(
    text: str, line: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(rx, "ROOT", tmp_path)
    doc = tmp_path / "DOC.md"
    doc.write_text(text)
    with pytest.raises(rx.MarkerError, match=rf"DOC\.md:{line}"):
        rx.parse(doc)


def test_markers_are_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rx, "ROOT", tmp_path)
    doc = tmp_path / "DOC.md"
    doc.write_text(
        "```python\nx = 1\n```\n"
        "<!-- test: continues previous; needs redis -->\n\n```python\nprint(x)\n```\n"
        "<!-- test: skip (a cluster named rabbit1..3; not here) -->\n```python\nboom()\n```\n"
        "<!-- test: runs until stopped -->\n```python\nrun()\n```\n"
    )
    first, second, third, fourth = rx.parse(doc)
    assert (first.line, first.needs, first.program) == (1, frozenset(), "x = 1\n")
    assert second.program == "x = 1\n\nprint(x)\n" and second.needs == {"redis"}
    assert third.skip == "a cluster named rabbit1..3; not here"
    assert fourth.until_stopped and fourth.needs == {"broker"}


def test_a_broken_block_fails_with_its_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(rx, "ROOT", tmp_path)
    doc = tmp_path / "DOC.md"
    doc.write_text(
        "text\n\n```python\nfrom delayq import load_topology\nload_topology\nboom()\n```\n"
    )
    [block] = rx.parse(doc)
    message = rx.run(block, tmp_path, {})
    assert message is not None
    assert message.startswith("DOC.md:3: the README's python block exited with 1")
    assert "NameError: name 'boom' is not defined" in message
    assert "    6 | boom()" in message


@pytest.mark.parametrize("block", rx.runnable(server=False), ids=rx.block_id)
def test_the_block_runs(block: rx.Block, tmp_path: Path) -> None:
    rx.prepare(block, tmp_path)
    message = rx.run(block, tmp_path, {})
    if message is not None:
        pytest.fail(message, pytrace=False)
