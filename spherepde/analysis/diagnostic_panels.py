"""The diagnostics panels of a result figure: the time series of docs/design.md "Diagnostics", one panel each, and a
training's.

A panel draws a diagnostic of the run and, in a solver = "both" file, of its particle run (prefix "particles_"),
with bands of +-2 standard errors where the run has them (`<name>_stderr`; a sweep draws none); "mass drift" is
|mass - mass(0)|, and w2_projection has the band W2 +- w2_quantisation_bound where it is wide enough to see.  The
under-resolved stretch (after `resolved_until`) is shaded and a failed run's last good save marked.  The checks of
the numerics (NUMERICS) sit in a row of their own below the physics; panels that say nothing (missing, all NaN,
constant) are left out.  A sweep (a `member` dimension) draws the diagnostics of every member, labelled by the swept
keys; a training (controls `W`, a cost per `iteration`) adds |W_t|_F per layer and J = l(mu_T) + lambda_reg / 2 int
|W_t|^2 dt over the optimiser's iterations.
"""

import math
import tomllib

import numpy as np

from spherepde.io.output import BOTH_PREFIX, failed_parts, time_text

# (title, variables, y scale): one panel each; "mass drift" is |mass - mass(0)|.  The physics first; the checks of
# the numerics (NUMERICS) in a lower row of their own, so that they never take a physics panel's place.
PANELS = [
    ("order parameter |∫x dρ|", ["order_parameter"], "linear"),
    ("alignment", ["alignment_E", "alignment_F"], "linear"),
    ("Lyapunov V_p", ["lyapunov"], "log"),
    ("W2(ρ_t, Π#ρ_0)", ["w2_projection"], "linear"),
    ("free energy F", ["free_energy"], "linear"),
    ("energy gap: E, or its interaction part, - min", ["energy_gap", "interaction_gap"], "log"),
    ("angle of the mean [rad]", ["mean_angle"], "linear"),
    ("adjoint |∇φ_t| in L²(μ_t)", ["adjoint_norm"], "log"),
    ("min ρ", ["min_density"], "linear"),
    ("spectral tail", ["spectral_tail"], "log"),
    ("mass drift |m - m(0)|", ["mass"], "linear"),
]
NUMERICS = ("min_density", "spectral_tail", "mass")


def stored_case(dataset) -> dict:
    """The run's resolved case (attribute `case`) as a table; {} if absent or unreadable."""
    return _case_of(dataset.attrs.get("case", ""))


def _case_of(text: str) -> dict:
    """A resolved case's text as a table; {} if unreadable."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        return {}


def _mark_failures(axis, dataset, vertical: bool = True) -> None:
    """A dashed red line at the last good save of each run of the file that failed (vertical: on a time axis
    along x; else along y), labelled for the legend."""
    for which, _, last_good in failed_parts(dataset):
        if last_good is not None:
            (axis.axvline if vertical else axis.axhline)(last_good, color="firebrick", ls="--", lw=1.0,
                                                         label=f"{which} failed after t = {time_text(last_good)}")


def _curves(dataset, name: str) -> list[tuple[str, object, object]]:
    """A diagnostic's curves as (label, values, standard error or None): the run's own and, in a
    solver = "both" file, the particle run's (prefix "particles_"); mass becomes its drift from t = 0."""
    own = "particles" if dataset.attrs.get("solver") == "particles" else "Eulerian"
    curves = []
    for key, label in ((name, own), (BOTH_PREFIX + name, "particles")):
        if key not in dataset:
            continue
        values, stderr = dataset[key], dataset.get(key + "_stderr")
        if not np.isfinite(values).any():
            continue
        if stderr is not None and not (np.nan_to_num(stderr.values) > 0).any():
            stderr = None
        if name == "mass":
            values = np.abs(values - values.isel(time=0))
        extra = [dim for dim in values.dims if dim not in ("time", "member")]
        if not extra:
            curves.append((label, values, stderr))
            continue
        for coordinate in values[extra[0]].values:
            pick = {extra[0]: coordinate}
            band = None if stderr is None else stderr.sel(pick)
            # one exponent's errors may all be NaN while another's are not (a particle run's lyapunov at
            # p >= dim(E) / 4): its band is not drawn, and a legend entry "± 2 s.e." would claim one
            if band is not None and not (np.nan_to_num(band.values) > 0).any():
                band = None
            curves.append((f"{label}, {extra[0]} = {float(coordinate):g}", values.sel(pick), band))
    return curves


def _informative(dataset, names: list[str]) -> bool:
    """False for panels that say nothing: missing, all NaN, constant, or Lyapunov when E is everything."""
    present = [key for name in names for key in (name, BOTH_PREFIX + name) if key in dataset]
    if not present or (names == ["mass"] and "density" not in dataset):  # particles carry mass 1 exactly
        return False
    if "lyapunov" in names and "alignment_E" in dataset and np.allclose(dataset["alignment_E"], 1, atol=1e-12):
        return False
    for name in present:
        values = np.asarray(dataset[name].values, dtype=float)
        finite = values[np.isfinite(values)]
        if finite.size and (name == "mass" or np.ptp(finite) > 1e-12 * max(1.0, np.abs(finite).max())):
            return True
    return False


def spans_a_decade(values) -> bool:
    """Whether positive values span a factor 10 or more: a log axis over less shows labelled minor ticks only
    (8.75 x 10^-1 beside 9 x 10^-1), which collide in a short panel, and no more than a linear one."""
    values = np.asarray(values, float)
    return values.max() >= 10 * values.min()


def _limits(axis, curves: list, scale: str) -> None:
    """Log scale where asked and every value is positive; y limits from the curves, with a margin
    of the typical band width, so that a band that blows up (a standard error at W2 = 0) is clipped."""
    values = np.concatenate([np.asarray(values, float).ravel() for _, values, _ in curves])
    values = values[np.isfinite(values)]
    if scale == "log" and values.size and values.min() > 0:
        if spans_a_decade(values):
            axis.set_yscale("log")
        return
    bands = [2 * np.asarray(stderr, float).ravel() for _, _, stderr in curves if stderr is not None]
    if not bands or not values.size:
        return
    low, high = values.min(), values.max()
    margin = max(0.05 * (high - low), float(np.nanmedian(np.concatenate(bands))))
    if margin > 0:
        axis.set_ylim(low - margin, high + margin)


def _member_curve(axis, time: np.ndarray, values: np.ndarray, colour, style: str, label: str,
                  resolved_until: float = np.inf):
    """A sweep member's curve through its own saves: the combined time axis is every member's save times, a
    member's values NaN at the others' (another time.save_every) and after a failure; a lone save is a dot.  From
    the member's own `resolved_until` on, the curve is faded (UNDER_RESOLVED_ALPHA)."""
    kept = np.isfinite(values)
    time, values = time[kept], values[kept]
    resolved = time <= resolved_until
    line = axis.plot(time[resolved], values[resolved], lw=1.2, color=colour, ls=style, label=label,
                     marker="o" if resolved.sum() == 1 else None, ms=3)[0]
    after = time >= (time[resolved][-1] if resolved.any() else -np.inf)  # from the last resolved save, joined
    if not resolved.all():
        axis.plot(time[after], values[after], lw=1.2, color=colour, ls=style, alpha=UNDER_RESOLVED_ALPHA,
                  marker="o" if after.sum() == 1 else None, ms=3)
    return line


# A sweep member's curve after its own loss of resolution (member_resolved_until) is drawn this faint: the members
# lose it at different times, where a single run's panels shade the under-resolved span instead.
UNDER_RESOLVED_ALPHA = 0.3


def member_colours(count: int) -> list:
    """A colour per sweep member, all different: matplotlib's ten cycle colours, tab20's twenty, else evenly
    spaced along viridis."""
    if count <= 10:
        return [f"C{i}" for i in range(count)]
    from matplotlib import colormaps

    if count <= 20:
        return [colormaps["tab20"](i) for i in range(count)]
    return [colormaps["viridis"](x) for x in np.linspace(0.0, 0.95, count)]


def _member_labels(dataset) -> list[str]:
    """One label per sweep member from its swept coordinates, and "failed" where its run did (member_status)."""
    names = [name for name in dataset.coords if dataset[name].dims == ("member",) and name != "member"]
    status = dataset["member_status"].values if "member_status" in dataset else ["completed"] * dataset.sizes["member"]
    return [(", ".join(f"{dataset[name].attrs.get('long_name', name).split()[-1]} = {dataset[name].values[i]}"
                       for name in names) or f"member {i}") + ("" if status[i] == "completed" else " (failed)")
            for i in range(dataset.sizes["member"])]


PANELS_PER_ROW = 4


def _filled_axes(subfigure, count: int, per_row: int = PANELS_PER_ROW, **subplot_kw) -> list:
    """`count` axes in rows of at most `per_row`, as even as they go, every row filled (no empty slots); none for
    count 0 (a failed run whose few saves make no diagnostic informative)."""
    if count == 0:
        return []
    rows = max(1, math.ceil(count / per_row))
    sizes = [count // rows + (row < count % rows) for row in range(rows)]
    parts = [subfigure] if rows == 1 else subfigure.subfigures(rows, 1)
    return [axis for part, size in zip(parts, sizes) for axis in part.subplots(1, size, squeeze=False,
                                                                                 subplot_kw=subplot_kw)[0]]


def _free_energy_title(dataset) -> str:
    """The free-energy panel's title: whether this flow dissipates F (spherepde.model.energy); in a sweep, whether
    every member's does (members may differ in eps, W or the kernel, so the base case's answer is not theirs)."""
    from spherepde.model.energy import FreeEnergy

    def dissipated(case: dict) -> bool | None:
        model = case.get("model", {})
        try:
            return FreeEnergy.of(model["kernel"], float(model["beta"]), model["B"], model["V"], model["W"],
                                 float(model["eps"]), controlled=bool(case.get("control"))).dissipated
        except (KeyError, TypeError, ValueError):
            return None

    if "member_case" in dataset:
        cases = [_case_of(str(text)) for text in dataset["member_case"].values]
    else:
        cases = [stored_case(dataset)]
    verdicts = {dissipated(case) for case in cases}
    if verdicts == {True}:
        return "free energy F (dissipated by this flow)"
    if verdicts == {False}:
        return "free energy F (W may raise it)"
    if verdicts == {True, False}:
        return "free energy F (dissipated in some members only)"
    return "free energy F"


# CF units of the density (docs/design.md "Output") as a figure writes them
UNIT_SYMBOLS = {"radian-1": "rad⁻¹", "sr-1": "sr⁻¹"}


def _with_units(title: str, units) -> str:
    """`title` with the file's `units` in brackets (min ρ is a value of the density: rad⁻¹ on S^1, sr⁻¹ on S^2);
    unchanged without units."""
    return f"{title} [{UNIT_SYMBOLS.get(units, units)}]" if units else title


# The quantisation band is drawn where its width 2 bound reaches this fraction of the largest w2_projection: a panel is
# some 300 pixels high, and a narrower band (a particle run's certified rearrangement excess, 2e-16 on S^1) is no
# pixel wide, only a legend entry.
VISIBLE_BAND = 1e-3


def _w2_bound(axis, dataset, time) -> None:
    """The band W2 +- w2_quantisation_bound (the largest over the run) around w2_projection (the Eulerian run's in a
    "both" file, whose attribute it is), where it is wide enough to see (VISIBLE_BAND)."""
    bound = dataset.attrs.get("w2_quantisation_bound")
    single = "member" not in dataset.dims
    if "w2_projection" in dataset and isinstance(bound, float) and 0 < bound < math.inf and single:
        values = dataset["w2_projection"].values
        if 2 * bound < VISIBLE_BAND * np.nanmax(np.abs(values), initial=0.0):
            return
        axis.fill_between(time, np.maximum(values - bound, 0), values + bound, color="0.6", alpha=0.18, lw=0,
                          label=f"± {bound:.2g}: w2_quantisation_bound, on the error of W2")


MEMBER_CURVE_STYLES = ("-", "--", ":", "-.")  # a sweep's curves of one panel (alignment_E, alignment_F)


def _panel_layout(dataset) -> tuple[list, list, int]:
    """(the diagnostic panels drawn, the checks of the numerics last; the training panels; how many checks)."""
    panels = [panel for panel in PANELS if _informative(dataset, panel[1])]
    training = [panel for panel in TRAINING_PANELS if panel[1] in dataset.dims and "member" not in dataset.dims]
    checks = [panel for panel in panels if panel[1][0] in NUMERICS]
    return [panel for panel in panels if panel not in checks] + checks, training, len(checks)


def _rows(panels: list, training: list, checks: int) -> tuple[int, int]:
    """(rows of the physics and training panels, rows of the checks below them; 0 where they share the rows) of a
    `_panel_layout`: `_diagnostics`'s arrangement."""
    physics = len(panels) - checks + len(training)
    if checks and physics:
        return math.ceil(physics / PANELS_PER_ROW), math.ceil(checks / PANELS_PER_ROW)
    return max(1, math.ceil((len(panels) + len(training)) / PANELS_PER_ROW)), 0


def panel_rows(dataset) -> int:
    """How many rows of panels `_diagnostics` draws for `dataset` (the figure's height follows them)."""
    return sum(_rows(*_panel_layout(dataset)))


def _diagnostics(subfigure, dataset) -> None:
    """One panel per informative diagnostic (the checks of the numerics in a row below the physics); bands of
    +-2 standard errors where the run has them."""
    panels, training, checks = _panel_layout(dataset)
    physics = len(panels) - checks + len(training)
    upper_rows, lower_rows = _rows(panels, training, checks)
    if lower_rows:
        top, bottom = subfigure.subfigures(2, 1, height_ratios=[upper_rows, lower_rows])
        upper = _filled_axes(top, physics)
        split = len(panels) - checks  # physics panels, then the checks, then the training panels
        axes = upper[:split] + _filled_axes(bottom, checks) + upper[split:]
    else:
        axes = _filled_axes(subfigure, len(panels) + len(training))
    time = dataset["time"].values
    resolved_until = dataset.attrs.get("resolved_until", "end")
    members = _member_labels(dataset) if "member" in dataset.dims else None
    if members is not None:
        colours = member_colours(len(members))
        member_until = (dataset["member_resolved_until"].values if "member_resolved_until" in dataset
                        else np.full(len(members), np.inf))
    member_lines = []  # a sweep's legend: a member's colour, the same in every panel
    for axis, (title, names, scale) in zip(axes, panels):
        # a panel of several variables names each curve by its variable (alignment_E beside alignment_F) in a legend,
        # also where one of them is there alone: the gap panel of a particle training draws interaction_gap, which
        # lacks eps Ent, and without its name it read as the Eulerian E - min E; styles by the variables present
        named = len(names) > 1
        present = [(name, own) for name, own in ((name, _curves(dataset, name)) for name in names) if own]
        styled = [(MEMBER_CURVE_STYLES[n], (f"{name}, {label}" if named else label, values, stderr))
                  for n, (name, own) in enumerate(present) for label, values, stderr in own]
        curves = [curve for _, curve in styled]
        for k, (variable_style, (label, values, stderr)) in enumerate(styled):
            if members is not None:  # colour by member, line style by curve (told apart in the panel's legend)
                style = MEMBER_CURVE_STYLES[k % len(MEMBER_CURVE_STYLES)]
                lines = [_member_curve(axis, time, np.asarray(values.isel(member=i)), colours[i], style, member,
                                       member_until[i]) for i, member in enumerate(members)]
                member_lines = member_lines or lines
                if named:
                    axis.plot([], [], color="0.3", ls=style, label=label)
                continue
            # a lone value (a single save, a run failed at its first interval) is a dot: a line of one point is not
            # drawn, and the panel was empty
            lone = int(np.isfinite(np.asarray(values, float)).sum()) == 1
            # a panel's later variables dashed: alignment_F equals alignment_E wherever V B^T and V share their top
            # eigenspace (B = I, B = V) and, drawn solid over it, hid it
            (line,) = axis.plot(time, values, lw=1.4, ls=variable_style, label=label, marker="o" if lone else None,
                                ms=3)
            if stderr is not None:
                axis.fill_between(time, values - 2 * stderr, values + 2 * stderr, color=line.get_color(), alpha=0.25,
                                  lw=0, label=f"{label} ± 2 s.e.")
        if names == ["w2_projection"]:
            _w2_bound(axis, dataset, time)
        # a sweep draws no bands (one curve a member): its margins are not theirs
        _limits(axis, curves if members is None else [(label, values, None) for label, values, _ in curves], scale)
        if members is None and not isinstance(resolved_until, str):
            # a "both" file's resolution is its Eulerian run's: the particle curves under the span are not in question
            under = "Eulerian under-resolved" if dataset.attrs.get("solver") == "both" else "under-resolved"
            axis.axvspan(float(resolved_until), time[-1], color="0.88", zorder=0, label=under)
        if members is None:
            _mark_failures(axis, dataset)
        if names == ["free_energy"]:
            title = _free_energy_title(dataset)
        elif names == ["min_density"]:
            title = _with_units(title, dataset["min_density"].attrs.get("units") if "min_density" in dataset else None)
        axis.set_title(title, fontsize=10)
        axis.set_xlabel("time (depth)")
        axis.grid(True, alpha=0.3)
        if members is None and (named or len(axis.get_legend_handles_labels()[0]) > 1):
            axis.legend(fontsize=7, frameon=False)
        elif members is not None and named:
            handles = [line for line in axis.get_lines() if line.get_label() in {label for label, _, _ in curves}]
            axis.legend(handles=handles, fontsize=7, frameon=False)
    for axis, (title, _, draw) in zip(axes[len(panels):], training):
        draw(axis, dataset)
        axis.set_title(title, fontsize=10)
        axis.grid(True, alpha=0.3)
    if member_lines:
        if np.isfinite(member_until).any():
            from matplotlib.lines import Line2D

            member_lines = member_lines + [Line2D([], [], color="0.3", alpha=UNDER_RESOLVED_ALPHA,
                                                 label="faded: under-resolved")]
        subfigure.legend(handles=member_lines, loc="outside right upper", fontsize=8, frameon=False)


def _controls(axis, dataset) -> None:
    """The Frobenius norm over depth of each parameter group the file stores per layer (W of the seeds' model; W1,
    b, W2 of a two-layer feed-forward; B, V of the heads): piecewise constant, layer l on
    [l t_end / L, (l + 1) t_end / L]."""
    groups = [name for name in dataset.data_vars if dataset[name].dims[:1] == ("layer",) and name != "layer_time"]
    t_end = float(stored_case(dataset).get("time", {}).get("t_end", dataset["time"].values[-1]))
    drawn = []
    for name in groups:
        values = dataset[name].values
        norms = np.sqrt((values.reshape(len(values), -1) ** 2).sum(1))
        # baseline=None: no drop to 0 at the ends
        axis.stairs(norms, t_end * np.arange(len(norms) + 1) / len(norms), lw=1.4, baseline=None, label=name)
        drawn.append(norms)
    every = np.concatenate(drawn) if drawn else np.zeros(1)
    if (every > 0).all() and spans_a_decade(every):
        axis.set_yscale("log")
    if len(groups) > 1:
        axis.legend(fontsize=7, frameon=False)
    axis.set_xlabel("time (depth)")


def _training_cost(axis, dataset) -> None:
    """The optimiser's course: J = l(mu_T) + lambda_reg / 2 int |W_t|^2 dt at each iteration."""
    axis.plot(dataset["iteration"].values, dataset["loss"].values, lw=1.4, marker=".", label="J")
    if "terminal_loss" in dataset:
        axis.plot(dataset["iteration"].values, dataset["terminal_loss"].values, lw=1.0, ls="--", marker="x",
                  label="l(μ_T)")
        axis.legend(fontsize=7, frameon=False)
    axis.set_xlabel("iteration")


# Training files (controls W per layer, a cost per iteration): (title, the dimension that marks them, drawing).
TRAINING_PANELS = [("controls per layer, |.|_F", "layer", _controls), ("training cost", "iteration", _training_cost)]
