"""Figures the user guide quotes, checked against an independent computation or against the page's own other
figures, so that a page that goes stale fails here."""

import pathlib
import re

import numpy as np
import pytest
from scipy.stats import t as student_t

import spherepde
from spherepde.analysis.compare import max_z_probability

GUIDE = pathlib.Path(__file__).resolve().parent.parent / "docs" / "guide"


def _prose(page: str) -> str:
    """The page's text with its line breaks as spaces, so that a sentence reads whole."""
    return " ".join((GUIDE / page).read_text(encoding="utf-8").split())


def _chance_of_worst(worst_z: float, values: int, dof: int) -> float:
    """P(max |T_i| >= worst_z) for `values` independent Student t of `dof` degrees of freedom: 1 - (1 - p)^M,
    p = P(|T| >= worst_z)."""
    return 1 - (1 - 2 * student_t.sf(worst_z, dof)) ** values


def test_compare_probabilities_quoted_for_the_compare_figure():
    """docs/guide/particles.md on results/compare.png (10 replicas: 9 degrees of freedom, 21 saves): the printed
    table gives each component's probability of its worst |z| over its 21 values, REPORT.nc the mean's over 42;
    the page once quoted the 42-value figure as the one compare prints."""
    text = _prose("particles.md")
    for worst, printed in ((3.01, 0.27), (3.60, 0.11)):  # mean[0], mean[1]
        assert _chance_of_worst(worst, 21, 9) == pytest.approx(printed, abs=0.005)
        z = np.zeros(21)
        z[7] = worst
        assert max_z_probability(z, 9) == pytest.approx(_chance_of_worst(worst, 21, 9), rel=1e-12)
    assert "`mean[0]` worst |z| 3.01, probability 0.27; `mean[1]` 3.60, 0.11" in text
    both = _chance_of_worst(3.60, 42, 9)
    assert both == pytest.approx(0.215, abs=5e-4)
    assert re.search(r"over all 42 values \(`max_z_probability_mean`\): 0\.215 ", text)


def test_defaults_quoted_by_the_guide_are_the_schemas():
    """Defaults the guide pages state in their prose, against a minimal case resolved by the schema."""
    case = spherepde.load_case_text('[sphere]\ndim = 2\n[time]\nt_end = 1.0\ndt = 0.1\n[control]\nloss = "align"\n')
    assert case["diagnostics"]["tail_tol"] == 1e-6  # case-files.md, numerics.md
    assert case["solver"]["kernel_tol"] == 1e-10  # numerics.md, attention-field.md
    assert case["solver"]["filter_order"] == 0  # numerics.md
    assert case["diagnostics"]["w2_atoms"] == 1000  # particles.md
    assert case["particles"]["save"] == 1000 and case["particles"]["n"] == 1000  # particles.md
    assert (case["control"]["optimizer"], case["control"]["learning_rate"], case["control"]["iterations"],
            case["control"]["checkpoint_every"]) == ("adam", 0.05, 100, 0)  # training.md
