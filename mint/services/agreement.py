"""The ruler with experts: how reviewers agree, how each grader agrees with them, and an eval
run read with expert verdicts overriding the grader's.

Agreement is Krippendorff's alpha (the `krippendorff` package): it takes any number of
reviewers, items that not every reviewer judged, and pass/fail (nominal) as well as scores
(interval). It is 1 for perfect agreement and 0 for agreement no better than chance. Beside it
every figure gives the plain share of agreeing pairs, which stays defined where alpha is not
(every verdict the same).

Each item with reviews has an expert verdict: the majority of its reviewers' pass/fail (a
review's `passed`, else its score of at least 0.5); an item whose reviewers split evenly is not
settled and overrides nothing. Each grader recorded in the items' snapshots (`overall`, and each
part of a composite grade, judges included) is compared with the settled verdicts; one whose
alpha (or, where alpha is undefined, whose share agreeing) falls below the threshold is
flagged, and flagged judges are listed by model. Reports cover one queue, or every queue over
runs of one benchmark version (the same trajectory in two queues is one unit, its reviews by
the same reviewer the newest one).

`judge_warnings` is the flag where a judge is used: a deployment's gate and an auto run read a
benchmark version's grades, and carry (without being stopped by) a warning for each judge of
that version the experts disagree with. It lives beside the services' kernel, not under
`evals`, so that the gates of `serving` can read it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any, Literal

import krippendorff
import numpy as np
from sqlalchemy import select
from sqlalchemy.orm import Session

from mint.errors import InvalidRequest
from mint.schemas.reviews import (
    DEFAULT_AGREEMENT_THRESHOLD,
    AgreementReport,
    ExpertTrajectory,
    ExpertVerdict,
    GraderAgreement,
    PairAgreement,
    ReviewerAgreement,
    RunWithExperts,
)
from mint.services import benchmarks, catalog
from mint.storage.tables import EvalRun, Review, ReviewItem, ReviewQueue, Trajectory

Level = Literal["nominal", "interval"]


@dataclass
class Unit:
    """One reviewed trajectory or capture: its graders' verdicts and each reviewer's."""

    source_id: str
    task_id: str
    graders: list[dict[str, Any]]
    verdicts: dict[str, bool] = field(default_factory=dict)
    scores: dict[str, float] = field(default_factory=dict)
    names: dict[str, str] = field(default_factory=dict)

    @property
    def expert(self) -> bool | None:
        """The reviewers' majority, or None when they split evenly (or there are none)."""
        passes = sum(self.verdicts.values())
        fails = len(self.verdicts) - passes
        return None if passes == fails else passes > fails


def reviews_of(session: Session, item_ids: Sequence[str]) -> dict[str, list[Review]]:
    """Each item's reviews, by reviewer in the order they were first given."""
    found: dict[str, list[Review]] = {item_id: [] for item_id in item_ids}
    if item_ids:
        rows = session.execute(
            select(Review).where(Review.item_id.in_(list(item_ids))).order_by(Review.created_at, Review.id)
        ).scalars()
        for row in rows:
            found[row.item_id].append(row)
    return found


def expert_passed(review: Review) -> bool:
    """A review's pass/fail: `passed` where given, else a score of at least 0.5."""
    if review.passed is not None:
        return review.passed
    return (review.score or 0.0) >= 0.5


def alpha(rows: Sequence[Sequence[float | None]], level: Level = "nominal") -> float | None:
    """Krippendorff's alpha of a reliability matrix (one row per coder, one column per unit,
    None where a coder gave no value); None where it is undefined (fewer than two pairable
    values, or a single value in the data)."""
    data = np.array([[np.nan if value is None else value for value in row] for row in rows], dtype=float)
    if data.size == 0:
        return None
    pairable = (np.sum(~np.isnan(data), axis=0) >= 2).sum()
    values = np.unique(data[~np.isnan(data)])
    if pairable == 0 or len(values) < 2:
        return None
    result = float(krippendorff.alpha(reliability_data=data, level_of_measurement=level))
    return result if math.isfinite(result) else None


def _share_agreeing(columns: Sequence[Sequence[bool]]) -> float | None:
    """The share of agreeing pairs of verdicts, over units with two or more."""
    agree = total = 0
    for column in columns:
        for a, b in combinations(column, 2):
            agree += a == b
            total += 1
    return agree / total if total else None


def _units(session: Session, items: Sequence[ReviewItem]) -> list[Unit]:
    """The items as units (one per source trajectory or capture), with their reviews merged."""
    given = reviews_of(session, [item.id for item in items])
    units: dict[str, Unit] = {}
    newest: dict[tuple[str, str], Review] = {}
    for item in items:
        unit = units.setdefault(
            item.source_id, Unit(item.source_id, item.task_id, list(item.snapshot.get("graders") or []))
        )
        for review in given[item.id]:
            key = (item.source_id, review.reviewer)
            if key in newest and newest[key].updated_at >= review.updated_at:
                continue
            newest[key] = review
            unit.verdicts[review.reviewer] = expert_passed(review)
            unit.names[review.reviewer] = review.reviewer_name
            if review.score is not None:
                unit.scores[review.reviewer] = review.score
            else:
                unit.scores.pop(review.reviewer, None)
    return [unit for unit in units.values() if unit.verdicts]


def _reviewer_agreement(units: list[Unit]) -> tuple[ReviewerAgreement, list[PairAgreement]]:
    reviewers = sorted({name for unit in units for name in unit.verdicts})
    nominal = [[_number(unit.verdicts.get(name)) for unit in units] for name in reviewers]
    scores = [[unit.scores.get(name) for unit in units] for name in reviewers]
    multi = [list(unit.verdicts.values()) for unit in units if len(unit.verdicts) >= 2]
    overall = ReviewerAgreement(
        items=len(multi),
        percent_agreement=_share_agreeing(multi),
        alpha=alpha(nominal),
        score_alpha=alpha(scores, "interval"),
    )
    pairs = []
    for a, b in combinations(reviewers, 2):
        both = [unit for unit in units if a in unit.verdicts and b in unit.verdicts]
        if not both:
            continue
        rows = [[_number(unit.verdicts[name]) for unit in both] for name in (a, b)]
        pairs.append(
            PairAgreement(
                a=_label(units, a),
                b=_label(units, b),
                items=len(both),
                percent_agreement=_share_agreeing([[unit.verdicts[a], unit.verdicts[b]] for unit in both]),
                alpha=alpha(rows),
            )
        )
    return overall, pairs


def _grader_agreement(units: list[Unit], threshold: float) -> list[GraderAgreement]:
    settled = [unit for unit in units if unit.expert is not None]
    seen: dict[str, dict[str, Any]] = {}
    for unit in settled:
        for view in unit.graders:
            seen.setdefault(view["name"], view)
    found = []
    for name, first in seen.items():
        pairs = [
            (view["passed"], unit.expert)
            for unit in settled
            for view in unit.graders
            if view["name"] == name and view["type"] == first["type"]
        ]
        share = _share_agreeing([[bool(grader), bool(expert)] for grader, expert in pairs])
        value = alpha([[_number(grader) for grader, _ in pairs], [_number(expert) for _, expert in pairs]])
        measure = value if value is not None else share
        found.append(
            GraderAgreement(
                grader=name,
                type=first["type"],
                model=first.get("model"),
                items=len(pairs),
                percent_agreement=share,
                alpha=value,
                flagged=measure is not None and measure < threshold,
            )
        )
    return found


def _number(verdict: bool | None) -> float | None:
    return None if verdict is None else float(verdict)


def _label(units: list[Unit], reviewer: str) -> str:
    """`<key name> (<key:id>)`: a reviewer as a person reads it, and as the API names it."""
    name = next((unit.names[reviewer] for unit in units if reviewer in unit.names), "")
    return f"{name} ({reviewer})" if name else reviewer


def report(
    session: Session,
    items: Sequence[ReviewItem],
    *,
    threshold: float,
    queue_id: str | None = None,
    benchmark_version_id: str | None = None,
) -> AgreementReport:
    """Agreement between the reviewers of `items`, and of each grader with their verdicts."""
    units = _units(session, items)
    reviewers, pairs = _reviewer_agreement(units)
    graders = _grader_agreement(units, threshold)
    flagged = sorted({grader.model or grader.grader for grader in graders if grader.flagged and grader.type == "judge"})
    return AgreementReport(
        queue_id=queue_id,
        benchmark_version_id=benchmark_version_id,
        threshold=threshold,
        items=len(units),
        reviews=sum(len(unit.verdicts) for unit in units),
        settled=sum(unit.expert is not None for unit in units),
        reviewers=reviewers,
        pairs=pairs,
        graders=graders,
        flagged_judges=flagged,
    )


def _items(session: Session, *where: Any) -> list[ReviewItem]:
    query = select(ReviewItem).join(ReviewQueue, ReviewQueue.id == ReviewItem.queue_id).where(*where)
    return list(session.execute(query.order_by(ReviewItem.created_at, ReviewItem.position)).scalars())


def queue_report(session: Session, queue: ReviewQueue, *, threshold: float) -> AgreementReport:
    items = _items(session, ReviewItem.queue_id == queue.id)
    return report(session, items, threshold=threshold, queue_id=queue.id)


def version_report(
    session: Session, organization_id: str, benchmark_id: str, version: int, *, threshold: float
) -> AgreementReport:
    """Agreement over every queue of the organization on runs of one benchmark version."""
    benchmark = benchmarks.get_benchmark(session, organization_id, benchmark_id)
    row = benchmarks.get_version(session, benchmark, version)
    items = _items(session, ReviewQueue.organization_id == organization_id, ReviewQueue.benchmark_version_id == row.id)
    return report(session, items, threshold=threshold, benchmark_version_id=row.id)


def judge_warnings(
    session: Session,
    organization_id: str,
    benchmark_version_id: str,
    *,
    threshold: float = DEFAULT_AGREEMENT_THRESHOLD,
) -> list[str]:
    """What a gate or an auto run reading this version's grades should say: one warning for each
    judge whose agreement with the experts on this version is below `threshold`, naming the
    judge's model, its alpha, the items it was measured on, and what to do about it."""
    items = _items(
        session,
        ReviewQueue.organization_id == organization_id,
        ReviewQueue.benchmark_version_id == benchmark_version_id,
    )
    if not items:
        return []
    found = report(session, items, threshold=threshold, benchmark_version_id=benchmark_version_id)
    warnings = []
    for grader in found.graders:
        if not (grader.flagged and grader.type == "judge"):
            continue
        measure = (
            f"Krippendorff's alpha {grader.alpha:.2f}"
            if grader.alpha is not None
            else f"alpha undefined, {100 * (grader.percent_agreement or 0.0):.0f}% agreeing"
        )
        warnings.append(
            f"judge {grader.model or grader.grader} ({grader.grader}) agrees with the experts below the threshold "
            f"{threshold:g} on benchmark version {benchmark_version_id}: {measure} over {grader.items} reviewed "
            f"items; its grades here may be wrong. Review more items of this version (mint reviews create) or "
            f"grade with another judge model (a new benchmark version)"
        )
    return warnings


def run_with_experts(session: Session, organization_id: str, eval_id: str) -> RunWithExperts:
    """A run's grades with the experts' settled verdicts overriding the grader's, both kept."""
    run: EvalRun = catalog.get_eval_run(session, organization_id, eval_id, param="eval_id")
    items = _items(session, ReviewQueue.eval_run_id == run.id)
    units = {unit.source_id: unit for unit in _units(session, items)}
    rows = session.execute(
        select(Trajectory.id, Trajectory.task_id, Trajectory.passed, Trajectory.score)
        .where(Trajectory.eval_run_id == run.id)
        .order_by(Trajectory.created_at, Trajectory.id)
    ).all()
    if not rows and run.status == "succeeded":
        raise InvalidRequest(f"eval run {run.id} recorded no trajectories", param="eval_id")
    listed, passes, grader_passes = [], 0, 0
    for trajectory_id, task_id, passed, score in rows:
        grader_passes += bool(passed)
        unit = units.get(trajectory_id)
        if unit is None:
            passes += bool(passed)
            continue
        settled = unit.expert
        final = settled if settled is not None else bool(passed)
        passes += final
        scores = list(unit.scores.values())
        listed.append(
            ExpertTrajectory(
                task_id=task_id,
                trajectory_id=trajectory_id,
                grader_passed=bool(passed),
                grader_score=float(score),
                expert=ExpertVerdict(
                    passed=settled,
                    score=sum(scores) / len(scores) if scores else None,
                    reviews=len(unit.verdicts),
                    reviewers=sorted(unit.verdicts),
                ),
                passed=final,
                differs=settled is not None and settled != bool(passed),
            )
        )
    total = len(rows)
    return RunWithExperts(
        eval_id=run.id,
        benchmark_version_id=run.benchmark_version_id,
        tasks=total,
        reviewed=len(listed),
        differs=sum(entry.differs for entry in listed),
        grader_pass_rate=grader_passes / total if total else 0.0,
        pass_rate=passes / total if total else 0.0,
        trajectories=listed,
    )
