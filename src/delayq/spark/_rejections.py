"""How a Spark job's summary speaks of its rejected rows (``schedule`` and ``cancel`` alike)."""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["rejection_lines", "rejections_said"]


def rejection_lines(errors: Mapping[str, int], errors_path: str | None, rejected: int) -> list[str]:
    """The summary's last lines: each cause with its count, and where the rows went."""
    lines = [f"rejected: {count} {error}" for error, count in sorted(errors.items())]
    if errors_path and rejected:
        lines.append(f"rejections written to {errors_path}")
    return lines


def rejections_said(errors: Mapping[str, int], errors_path: str | None) -> tuple[str, str]:
    """For a job refused by ``max_rejected``: the causes counted, and where the rows are."""
    causes = ", ".join(f"{n:,} {error}" for error, n in sorted(errors.items()))
    where = (
        f"they are in {errors_path}"
        if errors_path
        else "they are in the summary's rejections (give errors_path / --errors DIR "
        "to write them out)"
    )
    return causes, where
