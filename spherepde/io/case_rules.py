"""The cross-key rules of a case's sections: checks of a resolved section that look at several of its keys (or at
other sections) at once, each raising a CaseError that names the key to change.
"""

from __future__ import annotations

import math

from spherepde.base.errors import CaseError
from spherepde.io.case_files import negative_part
from spherepde.io.case_values import layered_lengths, list_depth


def model_rules(model: dict, ctx) -> None:
    heads = [("model.", model)] + [(f"model.extra_heads[{h}].", head)
                                   for h, head in enumerate(model.get("extra_heads", ()))]
    for prefix, head in heads:
        if head["beta"] == math.inf and head["kernel"] != "softmax":
            raise CaseError(f'{prefix}beta: "inf" needs {prefix}kernel = "softmax", got {head["kernel"]!r}')
        layers = head["B"] if list_depth(head["B"]) == 3 else [head["B"]]
        if head["beta"] == math.inf and not all(any(map(any, B)) for B in layers):
            raise CaseError(f'{prefix}B: must be nonzero (on every layer) at {prefix}beta = "inf" (the attention '
                            "goes to B^T x / |B^T x|, which B = 0 leaves 0/0 at every x)")
    lengths = layered_lengths(model)
    if len(set(lengths.values())) > 1:
        raise CaseError("model: the per-layer lists must have one length (the number of layers), got "
                        + ", ".join(f"{key}: {length}" for key, length in lengths.items()))


def initial_rules(initial: dict, ctx) -> None:
    if initial["kind"] == "file":
        problem = negative_part(initial)
        if problem:
            raise CaseError(f"initial.path: {problem}")
    if initial["kind"] != "vmf_mixture":
        return
    count = len(initial["means"])
    for key in ("kappas", "weights"):
        if len(initial[key]) != count:
            raise CaseError(f"initial.{key}: expected one entry per entry of initial.means "
                            f"({count}), got {len(initial[key])}")


_MAX_SAVES = 10 ** 6  # the save times are a list in memory
_MAX_STEPS_PER_SAVE = 10 ** 12  # beyond this a run would never end
# The stiffest diffusion mode over one step, dt eps lmax (lmax + 1): an IMEX step forms terms
# dt lam U_i of that size (its update leaves them out: spherepde.discretisation.timesteppers._terms,
# the S^1 heat equation in float32 exact to round-off at 1e15), and float32's eps lmax^2 overflows near 3e38.
_MAX_DIFFUSION_STIFFNESS = 1e15


def time_rules(time: dict, ctx) -> None:
    if not time["save_every"] > 0:
        raise CaseError(f"time.t_end: {time['t_end']!r} is too small: its default save_every, t_end / 20, rounds to 0")
    if "dt" in time and "cfl" in time:
        raise CaseError("time.dt: give either time.dt or time.cfl, not both")
    if time["t_end"] / time["save_every"] > _MAX_SAVES:
        raise CaseError(f"time.save_every: t_end / save_every = {time['t_end'] / time['save_every']:.3g} saves; "
                        f"at most {_MAX_SAVES:.0e}")
    eps, lmax = ctx.data["model"]["eps"], ctx.data["sphere"]["lmax"]
    longest_step = min(time["save_every"], time["t_end"], time.get("dt", math.inf))
    if eps * lmax * (lmax + 1) * longest_step > _MAX_DIFFUSION_STIFFNESS:
        raise CaseError(f"model.eps: {eps:.3g} makes the stiffness dt eps lmax (lmax + 1) of a step up to "
                        f"{eps * lmax * (lmax + 1) * longest_step:.3g} (dt <= min(t_end, save_every, time.dt)); "
                        f"at most {_MAX_DIFFUSION_STIFFNESS:.0e}, beyond which a diffusion step loses every digit")


def _fixed_step_rules(time: dict, dt: float, key: str) -> None:
    """A fixed step dt (given as `key`) must end: at most _MAX_STEPS_PER_SAVE steps per save, and within
    time.max_steps when there is one."""
    if min(time["save_every"], time["t_end"]) / dt > _MAX_STEPS_PER_SAVE:
        raise CaseError(f"{key}: {dt!r} makes more than {_MAX_STEPS_PER_SAVE:.0e} steps per save")
    if "max_steps" in time and math.ceil(time["t_end"] / dt - 1e-9) > time["max_steps"]:
        # at least t_end / dt steps with a fixed dt (each save interval is cut into whole steps): known now
        raise CaseError(f"time.max_steps: {time['max_steps']} steps cannot reach t_end = {time['t_end']:g} with "
                        f"{key} = {dt:g} (at least {math.ceil(time['t_end'] / dt - 1e-9)} steps)")


def particles_rules(particles: dict, ctx) -> None:
    # The fixed steps, here where the method is known (its section comes after [time]): time.dt is a density's
    # step and the particles' where they have none of their own; a particle run stepped by particles.dt never
    # takes time.dt's steps (time.max_steps was checked against them)
    time, method = ctx.data["time"], ctx.data["solver"]["method"]
    if "dt" in time and not (method == "particles" and "dt" in particles):
        _fixed_step_rules(time, time["dt"], "time.dt")
    if "dt" in particles and method in ("particles", "both"):
        _fixed_step_rules(time, particles["dt"], "particles.dt")
    if particles["save"] > particles["n"]:
        raise CaseError(f"particles.save: must be <= particles.n = {particles['n']}, got {particles['save']}")
    n, replicas = particles["n"], particles["replicas"]
    if n % replicas or n // replicas < 2:
        raise CaseError(f"particles.replicas: must divide particles.n = {n} into systems of at least 2 tokens, "
                        f"got {replicas}")


def control_rules(control: dict, ctx) -> None:
    for key, length in layered_lengths(ctx.data["model"]).items():
        if length != control["layers"]:
            raise CaseError(f"{key}: a list of {length} per-layer values, but control.layers = "
                            f"{control['layers']} (give one per layer, or one for all)")
    if "dt" not in ctx.data["time"]:
        raise CaseError("control: a training run needs time.dt (one fixed step grid for the forward and "
                        "adjoint runs), not time.cfl")
    if ctx.data["solver"]["method"] == "both":
        raise CaseError("control: training runs use solver.method = 'eulerian' or 'particles', not 'both' "
                        "(train each separately)")
    if control.get("noise") == "fresh" and control["optimizer"] == "lbfgs":
        raise CaseError("control.noise: 'fresh' noise makes J random, which the line search of 'lbfgs' cannot "
                        "use (take 'adam' or 'gd')")
    if control.get("noise") == "fresh" and control["tol"] > 0:
        raise CaseError("control.tol: with 'fresh' noise J changes between iterations by chance, so the stopping "
                        "rule would stop at random (set control.tol = 0 and a number of iterations)")
