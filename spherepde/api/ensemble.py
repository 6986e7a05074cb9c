"""Members run together: which cases one tensor program can advance at once, and running them.

The solvers take a member axis (solvers.forward_problem.ForwardProblem, solvers.particles.ParticleSystem, the
trainings' lockstep): members that share a grid and the shapes of their state run as one batch, each with its
own initial law, model matrices and scalars, seed and (for trainings) its own optimizer and loss.  `batches`
groups the cases of a sweep by what they must share, `run_batch` runs one group and returns per member what its
serial run returns: its Dataset, or the NumericalFailure (with the last good state) or CaseError that ended it.

What members may differ in (MEMBER_KEYS): the case's name and description, every model matrix and scalar but the
kernel (beyond the seeds' model the feed-forward's W1, b, W2 and the ffn_seed that draws W1, and the extra heads' B
and V: every member's parameters_of rides in the programs' theta (M, L, p)), the whole [initial] section,
particles.seed and particles.save, the [diagnostics] section, and of a training's [control] its loss and target,
lambda_reg, the optimizer and its learning rate, iterations and tolerance, the bow candidates' keys and
save_adjoint. Everything else (sphere, time, solver, the particles' size, replicas and integrator, the layers and
the gradient) is shared, and so must be what it implies: the time scheme of a density ("auto" depends on eps),
whether beta is infinite, whether the particles are noisy, which sums a particle run takes (the direct sums serve
beta > 0 only; beyond their unshifted exponent range, solvers.particle_field.within_direct_range, the softmax's
kernel rows are shifted and the unnormalized kernel takes the generic sums: a batch mixing the two would take one
way where a member's serial run takes the other, apart at round-off; so for a member on the seeds' paths,
solvers.particles.on_seeds_paths, beside one off them), and beyond the seeds' model the layout: the heads' number,
kernels and betas (head 0's among them: the layered transport and the Eulerian adjoint read one beta per head,
spherepde.model.parameters.Layout.heads), the hidden width, the activation and the layers.
Particle runs stepped by the CFL rule (no fixed dt) each run alone: their members would take different steps and
their draws would not be those of their serial runs.
"""

import math

import numpy as np

from spherepde.base.errors import CaseError, NumericalFailure
from spherepde.io.case import Case
from spherepde.model.parameters import layout_of

MEMBER_KEYS = {
    "case": None,  # every key
    # beyond the seeds: the feed-forward's matrices (W1 drawn from ffn_seed) and the extra heads' B and V ride in
    # each member's theta_l (parameters_of); their kernels and betas, the hidden width and the activation are the
    # layout's, shared (batch_key's implied part)
    "model": {"B", "V", "W", "beta", "eps", "W1", "b", "W2", "ffn_seed", "extra_heads"},
    "initial": None,
    "particles": {"seed", "save"},
    "diagnostics": None,
    "control": {"loss", "target", "lambda_reg", "optimizer", "learning_rate", "iterations", "tol", "kappa_cand", "tau",
                "K", "seed", "save_adjoint"},
}


def shared_keys(case: Case) -> dict:
    """The case without its member keys (MEMBER_KEYS): the sections and keys every member of a batch gives alike."""
    return {section: {key: value for key, value in values.items()
                      if MEMBER_KEYS.get(section, set()) is not None and key not in MEMBER_KEYS.get(section, set())}
            for section, values in case.data.items()}


def batch_key(case: Case, index: int) -> tuple:
    """What every member of a batch shares: the case without its member keys, and what those keys imply."""
    from spherepde.discretisation.timesteppers import choose_scheme

    shared = shared_keys(case)
    model, method = case["model"], case["solver"]["method"]
    scheme = choose_scheme(case["time"]["scheme"], model["eps"]) if method != "particles" else None
    layout = layout_of(case)
    # the seeds' paths share the layers of their W_l (their time grid), a layered transport its whole layout
    implied = (scheme, math.isinf(model["beta"]), model["eps"] > 0, ("seeds", layout.layers) if layout.seeds_model
               else (layout.heads, layout.hidden, layout.activation, layout.layers))
    if method != "eulerian":
        import torch

        from solvers.particle_field import within_direct_range
        from solvers.particles import on_seeds_paths
        from spherepde.base.device import placement
        from spherepde.model.parameters import parameters_of

        # B may be given per layer: its largest spectral norm
        norm = float(np.linalg.norm(np.array(model["B"], dtype=float), 2, axis=(-2, -1)).max())
        # beta = 0 (a constant kernel) takes the generic sums (ParticleField.is_direct), the same case at beta > 0
        # the direct ones: a batch of both would take the generic sums for all, apart from their serial runs.  So
        # would a member on the seeds' paths (a list of one W per layer repeating one matrix, say) batched with one
        # off them (its layers' W differing): ParticleSystem steps every member the general way once one must be
        host = placement("cpu", case["solver"]["dtype"])
        implied += (within_direct_range(model["beta"] * norm, getattr(torch, case["solver"]["dtype"])),
                    model["beta"] > 0, on_seeds_paths(layout, parameters_of(case, layout, host)))
        if "dt" not in case["particles"] and "dt" not in case["time"]:
            implied += (index,)  # CFL-stepped particles run alone
    if method == "both":
        implied += (index,)
    return repr(sorted((section, sorted(values.items(), key=lambda item: item[0])) for section, values in
                       shared.items())), implied


def batches(cases: list, largest: int | None = None) -> list:
    """The members (indices into `cases`) grouped into batches that one program can run, in order of their first
    member; batches of at most `largest` members."""
    groups = {}
    for index, case in enumerate(cases):
        groups.setdefault(batch_key(case, index), []).append(index)
    out = []
    for members in groups.values():
        size = largest or len(members)
        out += [members[start:start + size] for start in range(0, len(members), size)]
    return sorted(out, key=lambda members: members[0])


def run_batch(cases: list, progress: bool | None = None) -> list:
    """Run the members `cases` (Cases, else a TypeError; one batch of `batches`, else a ValueError) together; per
    member its Dataset, or the NumericalFailure or CaseError that ended it (a CaseError of the batch's setup: each
    member then alone, so that it is the bad members' own, naming the case file)."""
    others = sorted({type(member).__name__ for member in cases if not isinstance(member, Case)})
    if others:  # as spherepde.run: an AttributeError of `checked` read as the solver's own failure
        raise TypeError(f"run_batch takes a list of Case (spherepde.load_case), got {', '.join(others)}")
    try:
        cases = [member.checked() for member in cases]  # as spherepde.run: a member's edits in place applied
        check_one_batch(cases)
        case = cases[0]
        method = case["solver"]["method"]
        if case["control"]:
            if method == "particles":
                from solvers.particle_training import run_particle_trainings

                return run_particle_trainings(cases, progress)
            from solvers.training import run_trainings

            return run_trainings(cases, progress)
        if method == "particles":
            from solvers.particles import ParticleSystem, run_members

            return run_members(ParticleSystem(cases), progress)
        if method == "eulerian":
            from solvers.eulerian import run_members
            from solvers.forward_problem import ForwardProblem

            return run_members(ForwardProblem(cases), progress)
        from spherepde import run

        return [_outcome(lambda member=member: run(member, progress=progress)) for member in cases]
    except CaseError as error:
        if len(cases) > 1:  # one bad member fails the batch's setup: which one(s)
            return [outcome for member in cases for outcome in run_batch([member], progress)]
        return [cases[0].named(error)]


def check_one_batch(cases: list) -> None:
    """A ValueError where `cases` are not one batch of `batches`, naming a shared key they differ in.  The programs
    take the shared keys from the first member: a second member of another time.t_end, time.dt or sphere.lmax ran
    with the first's, its Dataset holding the first's saves under its own case attribute."""
    groups = batches(cases)
    if len(groups) == 1:
        return
    if not groups:  # an IndexError from deep inside before
        raise ValueError("run_batch: no cases (a batch holds one member or more)")
    first, other = groups[0][0], groups[1][0]
    a, b = shared_keys(cases[first]), shared_keys(cases[other])
    differing = [f"{section}.{key}" for section in a for key in {**a[section], **b.get(section, {})}
                 if a[section].get(key) != b.get(section, {}).get(key)]
    why = (f"they differ in {', '.join(differing)}" if differing else
           "what their member keys imply differs (the time scheme, an infinite beta, noise, the particles' sums, a "
           "CFL-stepped particle run, which runs alone, or solver.method = 'both')")
    raise ValueError(f"run_batch: cases {first} and {other} cannot run as one batch: {why}; group them with "
                     f"spherepde.api.ensemble.batches(cases) and run each group")


def _outcome(solve):
    """solve()'s Dataset, or the NumericalFailure or CaseError it raised."""
    try:
        return solve()
    except (NumericalFailure, CaseError) as error:
        return error
