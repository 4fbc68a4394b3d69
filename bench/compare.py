"""Before and after, in one run: a bench script of two revisions against one broker.

A refactor must not cost throughput, and two separate bench runs on a shared
machine differ more than most refactors do. This script measures both sides in
the same run, on the same broker, alternating which goes first:

    .venv/bin/python bench/compare.py --before main~3 -- consume.py --count 20000 --rounds 1
    .venv/bin/python bench/compare.py --before v0.1 --after HEAD -- publish.py --rounds 1

``--before`` and ``--after`` are git revisions (``--after`` defaults to the
working tree). Each is checked out into a temporary worktree (the working tree
is used as it is), and the bench script of that revision runs with that
revision's ``src/`` first on ``PYTHONPATH``, so each side measures its own
delayq against the same raw client. Every bench script prints its own ratio to
the raw client; this script prints each run's table, then the median ratio of
every mode for both sides and their difference.

The broker is ``--url``, else ``$RABBITMQ_URL``, else a throwaway local node
shared by every run. Exit status 1 if a run fails.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from benchlib import broker, log, positive_int

ROOT = Path(__file__).resolve().parent.parent


@contextlib.contextmanager
def checkout(revision: str | None) -> Iterator[tuple[Path, str]]:
    """A tree of ``revision`` (the working tree for None) and a name for it."""
    if revision is None:
        yield ROOT, "working tree"
        return
    sha = git("rev-parse", "--short", f"{revision}^{{commit}}")
    with tempfile.TemporaryDirectory(prefix="delayq-compare-") as tmp:
        tree = Path(tmp) / "tree"
        git("worktree", "add", "--detach", "--quiet", str(tree), sha)
        try:
            yield tree, f"{revision} ({sha})"
        finally:
            git("worktree", "remove", "--force", str(tree))


def git(*args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(ROOT), *args], check=True, capture_output=True, text=True
    )
    return done.stdout.strip()


def run_bench(tree: Path, script: str, args: Sequence[str], url: str) -> str:
    """One run of ``tree``'s bench script against ``url``; its stdout (the report)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tree / "src"), str(tree / "bench")]))
    command = [sys.executable, str(tree / "bench" / script), *args, "--url", url]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(
            f"compare: {script} of {tree} exited {done.returncode}:\n{done.stderr[-2000:]}"
        )
    return done.stdout


def ratios(report: str) -> dict[str, float]:
    """Mode label -> ratio, from the first table of a bench report (the header names a
    right-aligned ``ratio`` column; rows end that column at the same place)."""
    lines = report.splitlines()
    found: dict[str, float] = {}
    for index, line in enumerate(lines):
        if "ratio" not in line.split():
            continue
        end = line.index("ratio") + len("ratio")
        for row in lines[index + 1 :]:
            if not row.strip():
                return found
            cells = row[:end].split()
            if len(cells) < 2 or not _numeric(cells[-1]):
                continue
            label = list(cells[:-1])
            while label and _numeric(label[-1]):
                label.pop()
            found[" ".join(label)] = float(cells[-1].replace(",", ""))
        return found
    return found


def _numeric(cell: str) -> bool:
    try:
        float(cell.replace(",", ""))
    except ValueError:
        return False
    return True


def parse_args(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    if "--" not in argv:
        raise SystemExit("compare: give the bench script after --, e.g. -- consume.py --rounds 1")
    cut = list(argv).index("--")
    parser = argparse.ArgumentParser(
        prog="bench/compare.py",
        description="A bench script of two revisions against one broker, in one run.",
    )
    parser.add_argument("--before", required=True, help="git revision measured as 'before'")
    parser.add_argument("--after", help="git revision measured as 'after' (default: working tree)")
    parser.add_argument("--url", help="broker URL (default: $RABBITMQ_URL, else a local node)")
    parser.add_argument(
        "--runs", type=positive_int, default=2, help="runs of each side, alternating (default 2)"
    )
    args = parser.parse_args(argv[:cut])
    bench = list(argv[cut + 1 :])
    if not bench or not (ROOT / "bench" / bench[0]).is_file():
        raise SystemExit(f"compare: no bench script {bench[:1]} in bench/")
    return args, bench


def main(argv: Sequence[str] | None = None) -> int:
    args, bench = parse_args(list(sys.argv[1:] if argv is None else argv))
    script, script_args = bench[0], bench[1:]
    with contextlib.ExitStack() as stack:
        before = stack.enter_context(checkout(args.before))
        after = stack.enter_context(checkout(args.after))
        url, _node = stack.enter_context(broker(args.url))
        sides = {before[1]: before[0], after[1]: after[0]}
        seen: dict[str, list[dict[str, float]]] = {name: [] for name in sides}
        for run in range(args.runs):
            order = list(sides) if run % 2 == 0 else list(reversed(sides))
            for name in order:
                log(f"run {run + 1}/{args.runs}: {script} of {name} ...")
                report = run_bench(sides[name], script, script_args, url)
                print(f"## run {run + 1}, {name}\n{report}\n", flush=True)
                seen[name].append(ratios(report))
    print(summary(script, seen))
    return 0


def summary(script: str, seen: dict[str, list[dict[str, float]]]) -> str:
    (b_name, b_runs), (a_name, a_runs) = seen.items()
    modes = [m for m in b_runs[0] if all(m in r for r in (*b_runs, *a_runs))]
    width = max((len(m) for m in modes), default=10) + 2
    lines = [
        f"{script}: median ratio to the raw client, {len(b_runs)} runs a side",
        f"{'mode':<{width}}{'before':>8}{'after':>8}{'change':>9}",
    ]
    for mode in modes:
        b = statistics.median(r[mode] for r in b_runs)
        a = statistics.median(r[mode] for r in a_runs)
        lines.append(f"{mode:<{width}}{b:>8.2f}{a:>8.2f}{(a - b) / b:>+9.0%}")
    lines += [f"before: {b_name}", f"after:  {a_name}"]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
