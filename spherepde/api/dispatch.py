"""Which solver a case names, and running it: the one entry point behind `spherepde.run` and `spherepde run`."""

import warnings
from typing import TYPE_CHECKING

from spherepde.base.errors import CaseError, NumericalFailure

if TYPE_CHECKING:  # the case module brings in numpy and xarray: not at `import spherepde`
    from spherepde.io.case import Case


def run(case: "Case", progress: bool | None = None, checkpoint=None):
    """Run a case with the solver its [solver] method names; returns an xarray.Dataset.

    torch runs on solver.threads CPU threads meanwhile (spherepde.base.threads: one on small problems).

    `progress` (on sys.stderr): None chooses by the stream (a bar on a terminal, a line every 30 s in a log), True
    always a bar, False none.

    "both" runs the Eulerian solver and then the particles, and returns one Dataset: the
    Eulerian run's variables and attributes as they are, the particle run's diagnostics and
    attributes prefixed with ``"particles_"``, and the positions `particles` (see
    `spherepde.io.output.both_dataset`; `spherepde.io.output.split_both` undoes it).  When one of the two fails
    numerically the other still runs, and the NumericalFailure carries the combined Dataset (the failed run's
    saves up to its failure, NaN after).

    `checkpoint` (a :class:`solvers.checkpoint.Checkpoint`) stores the state of a long run
    now and then and, when marked `resume`, continues the run from it.

    A case with a [control] section is a training run: W is trained, and the Dataset is the
    forward run with the trained W plus `W`, `loss`, `adjoint_norm`; of the density
    (solvers.training.run_training) with solver.method = "eulerian", of the particle system
    (solvers.particle_training.run_particle_training) with "particles".  A training keeps its
    evaluations of J and dJ/dW in the checkpoint (solvers/journal.py).
    """
    from spherepde.api.limits import check_memory, oversubscription
    from spherepde.base.garbage import thawed_after
    from spherepde.base.threads import threads_for  # torch is imported by the run, not by `import spherepde`
    from spherepde.io.case import Case

    if not isinstance(case, Case):
        raise TypeError(f"spherepde.run takes a Case (spherepde.load_case(path), spherepde.load_case_text or "
                        f"spherepde.io.case.case_from_dict), got {type(case).__name__}")
    if progress is not None and not isinstance(progress, bool):
        raise TypeError(f"spherepde.run: progress is True, False or None, got {progress!r}")
    if checkpoint is not None and not hasattr(checkpoint, "resume"):
        raise TypeError(f"spherepde.run: checkpoint is a solvers.checkpoint.Checkpoint or None, got "
                        f"{type(checkpoint).__name__} (Checkpoint(output_path, every_steps, every_minutes, resume))")
    case = case.checked()  # a case's edits in place applied as --set would apply them (a bad one refused)
    if note := oversubscription(case):  # the command line says it in a line of its own
        warnings.warn(note, RuntimeWarning, stacklevel=2)
    with case.naming_errors():
        check_memory(case)  # for the API: the command line has checked it already, before taking the lock
        # the objects frozen for the run (the caller's among them) collected again after it: spherepde/base/garbage.py
        with threads_for(case), thawed_after():
            return _run(case, progress, checkpoint)


def check_case(case: "Case", device_type: str | None) -> None:
    """What a run refuses from its case alone, before any work (a CaseError): a kernel beyond its dtype, a grid too
    coarse for its kernels, the solvers' choices on a `device_type` ("cpu", "cuda"; None: on any), and a particle
    run's drift choices and fixed step beyond its noise step.  The solvers check them again as they start; a sweep
    checks every member so before any runs, a "both" run its case before its Eulerian half."""
    from solvers.forward_problem import check_kernel_range, check_kernel_resolution, check_solver_choices
    from solvers.particles import check_drift_choices, check_fixed_noise_step

    method = case["solver"]["method"]
    check_kernel_range(case)
    check_kernel_resolution(case)
    if method != "particles":
        check_solver_choices(case, device_type)
    if method != "eulerian":
        check_drift_choices(case)
        check_fixed_noise_step(case)


def _run(case: "Case", progress: bool | None, checkpoint):
    method = case["solver"]["method"]
    if case["control"]:
        if method == "particles":
            from solvers.particle_training import run_particle_training

            return run_particle_training(case, progress=progress, checkpoint=checkpoint)
        from solvers.training import run_training

        return run_training(case, progress=progress, checkpoint=checkpoint)
    if method == "particles":
        if checkpoint is not None:
            raise CaseError("checkpoints are available for the Eulerian solver and trainings only (a particle run "
                            "is reproduced bit for bit by its seed)")
        from solvers.particles import run_particles

        return run_particles(case, progress=progress)
    from solvers.eulerian import run_eulerian

    if method == "eulerian":
        return run_eulerian(case, progress=progress, checkpoint=checkpoint)
    from solvers.particles import run_particles
    from spherepde.io.output import both_dataset

    # the particle half's refusals too before the Eulerian half's work: refused after it, the run ended with exit 2
    # and no output but left that half's checkpoint folder behind
    check_case(case, None)
    # each solver's failure keeps its last good state, and the other solver still runs
    if checkpoint is not None:
        checkpoint.at_end = True  # an interrupt in the particle half keeps the Eulerian half whole
    eulerian, eulerian_failure = _kept_on_failure(lambda: run_eulerian(case, progress=progress, checkpoint=checkpoint))
    if checkpoint is not None and checkpoint.interrupted:  # it came after the last step, its checkpoint written
        raise KeyboardInterrupt
    particles, particle_failure = _kept_on_failure(lambda: run_particles(case, progress=progress))
    combined = both_dataset(eulerian, particles)
    failure = eulerian_failure or particle_failure
    if failure is not None:
        failure.dataset = combined
        raise failure
    return combined


def _kept_on_failure(solve):
    """(dataset, None) from solve(), or (its last good state, the NumericalFailure) when it fails with one."""
    try:
        return solve(), None
    except NumericalFailure as failure:
        if failure.dataset is None:
            raise
        return failure.dataset, failure
