"""The step-time model against the seeds' published numbers: every case within 25% (fit and held out alike), every
published ordering right, and the fitted constants are what the fit gives (docs/performance-model.md)."""

import sys
from pathlib import Path

import pytest
import seed_cases

import grpo_launch.estimate.step_time as model

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import fit_step_time  # noqa: E402

TOLERANCE = 0.25


@pytest.mark.parametrize("case", seed_cases.CASES, ids=[c.name for c in seed_cases.CASES])
def test_each_published_number_within_a_quarter(case):
    assert abs(seed_cases.error(case)) <= TOLERANCE, f"{case.name}: predicted {case.predicted():.3g}, published " \
                                                     f"{case.published:.3g}"


@pytest.mark.parametrize("ordering", seed_cases.ORDERINGS, ids=[o.name for o in seed_cases.ORDERINGS])
def test_each_published_ordering_holds(ordering):
    assert ordering.holds(), f"{ordering.name}: {ordering.values()}"


def test_the_held_out_cases_outnumber_the_fitted_constants():
    held_out = [c for c in seed_cases.CASES if c.role == "held out"]
    assert len(fit_step_time.FITTED) == 4 and len(held_out) + len(seed_cases.ORDERINGS) >= 12


def test_the_docs_table_is_current():
    text = (Path(__file__).resolve().parents[1] / "docs" / "performance-model.md").read_text()
    documented = text.split("<!-- seed-table -->\n", 1)[1].split("\n<!-- /seed-table -->", 1)[0]
    assert documented == seed_cases.table(), "paste the table `python benchmarks/fit_step_time.py` prints"


def test_the_fitted_constants_are_the_fit():
    fitted = fit_step_time.fit()
    for name, value in fitted.items():
        assert getattr(model, name) == pytest.approx(value, rel=0.01), name
