"""Benchmarks that measure delivery fail (exit 1) when a message was lost or early: a
table of figures over a broken run is no measurement."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _load(name: str) -> ModuleType:
    # bench/ is a folder of scripts (they import benchlib as a sibling), not a package.
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while being built
    spec.loader.exec_module(module)
    return module


def test_lateness_fails_on_a_missing_or_early_message_in_any_mode() -> None:
    lateness = _load("lateness")
    fine = [lateness.Result("naive"), lateness.Result("tiered")]
    assert lateness.verdict(fine) is None
    broken = [
        lateness.Result("naive"),
        lateness.Result("tiered", missing=3),
        lateness.Result("exact", early=1),
    ]
    assert lateness.verdict(broken) == "tiered: 3 missing, 0 early; exact: 0 missing, 1 early"


def test_the_webapp_bench_fails_when_a_request_failed() -> None:
    webapp = _load("webapp")
    fine = webapp.Run(1000.0, 1.0, 2.0, 5000, 0, 100.0, 5.0)
    broken = webapp.Run(900.0, 1.0, 2.0, 4000, 100, 100.0, 5.0)
    runs = {("asgi", "freeze", "none"): [fine], ("asgi", "freeze", "publish"): [fine, broken]}
    assert webapp.verdict({("asgi", "freeze", "none"): [fine]}) is None
    found = webapp.verdict(runs)
    assert found is not None and "asgi freeze publish: 100" in found
