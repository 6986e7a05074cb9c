"""The direct-attention particle step as one array program and its transpose (solvers/particle_step.py), at the
seed's scale of a system (64 tokens, the bag-of-words loss, eps = 1e-2, Heun with the noise split): its dJ/dW is
autograd's through the same program and the central differences of J; batched members are their serial runs.  The
softmax beyond the unshifted kernel's exponent range (beta = 1000), its kernel rows shifted, against the generic path
and the central differences."""

import numpy as np
import pytest
import torch
from test_particle_training import by_hand_and_by_autograd

from solvers.controlled_forward import central_differences_of
from solvers.particle_training import ParticleControl
from spherepde.io.case import case_from_dict


def seed_member(seed: int, kernel: str = "unnormalized", B=((1.0, 0.0), (0.0, 0.65)), steps: int = 20,
                beta: float = 1.0):
    """The seed-004 particle training (bow loss, A = diag(1, 0.65), eps = 1e-2, particles.dt = 0.01) over
    `steps` steps and two layers."""
    return case_from_dict({
        "case": {"name": "seed-step"}, "sphere": {"dim": 2, "lmax": 16},
        "model": {"kernel": kernel, "beta": beta, "B": [list(row) for row in B], "V": [[1.0, 0.0], [0.0, 0.65]],
                  "eps": 0.01},
        "initial": {"kind": "vmf", "mean": [1.0, 0.5], "kappa": 1.0},
        "time": {"t_end": 0.01 * steps, "dt": 0.01, "save_every": 0.005 * steps},
        "solver": {"method": "particles", "device": "cpu", "field": "dense"},
        "particles": {"n": 64, "seed": seed, "integrator": "heun"},
        "control": {"loss": "bow", "target": [0.0, 1.0], "lambda_reg": 0.01, "layers": 2, "tau": 4.0, "K": 16,
                    "kappa_cand": 2.0, "seed": 0}})


def controls_of(members: int, scale: float = 0.3) -> torch.Tensor:
    generator = torch.Generator().manual_seed(5)
    return scale * torch.randn(members, 2, 2, 2, generator=generator, dtype=torch.float64)


@pytest.mark.parametrize("kernel, B", [("unnormalized", ((1.0, 0.0), (0.0, 0.65))),
                                       ("softmax", ((1.0, 0.3), (-0.2, 0.65)))])
def test_transpose_is_autograds_through_the_same_program(kernel, B):
    """The hand-written transposes against torch autograd through the very step program (its torch namespace),
    64 tokens, 20 noisy Heun steps: dJ/dW to 1e-12 relative, and the same J (one forward pass)."""
    by_hand, by_autograd = by_hand_and_by_autograd(ParticleControl(seed_member(0, kernel, B)), controls_of(1)[0])
    assert by_hand.cost == by_autograd.cost
    assert float((by_hand.dW - by_autograd.dW).norm() / by_autograd.dW.norm()) <= 1e-12


def test_gradient_is_the_central_differences_of_the_cost():
    """dJ/dW against (J(W + h E_k) - J(W - h E_k)) / 2h in all 8 entries (h = 1e-5: O(h^2) = 1e-10 and J's
    round-off over h, about 1e-11, both far below the 1e-7 asked)."""
    forward = ParticleControl(seed_member(1))
    controls = controls_of(1)[0]
    gradient = forward.gradient(controls)
    assert gradient.cost == forward.cost_of(controls)
    numerical = central_differences_of(forward.cost_of, controls)
    assert float((gradient.dW - numerical).norm() / numerical.norm()) <= 1e-7


def test_batched_members_are_their_serial_evaluations_bit_for_bit():
    """Three members (other seeds, another B) in one program: each member's J and dJ/dW are its serial ones."""
    cases = [seed_member(0), seed_member(4), seed_member(2, B=((1.0, 0.2), (0.1, 0.65)))]
    controls = controls_of(3)
    batched = ParticleControl(cases).gradients(controls)
    for case, member, W in zip(cases, batched, controls):
        serial = ParticleControl(case).gradient(W)
        assert member.cost == serial.cost
        assert torch.equal(member.dW, serial.dW)


def test_forward_run_is_the_torch_programs():
    """The numpy program (CPU) and the torch one (autograd's) take the same steps to round-off: X(T) within 1e-13
    after 200 steps of 64 tokens (the same formulas; only exp's and the products' last bits differ)."""
    forward = ParticleControl(seed_member(3, steps=200))
    controls = controls_of(1)
    with torch.no_grad():
        numpy_run = forward.run(forward.x0, controls)
    with torch.enable_grad():
        torch_run = forward.run(forward.x0, controls.clone().requires_grad_(True)).detach()
    assert np.abs((numpy_run - torch_run).numpy()).max() <= 1e-13


def program_against_generic_step(dim: int, kernel: str, integrator: str, eps: float, n: int = 16, beta: float = 1.5,
                                 dtype: str = "float64") -> float:
    """max |x - x'| after five steps of the program and of the solver's other path, which shares none of its code
    for the field: the shifted kernel sums of particle_field.SystemKernel (spherepde.kernels.dense) under the
    explicit tableaux of spherepde.discretisation.timesteppers, with a non-symmetric B (|B|_2 about 1.1), two
    replica systems of n / 2 tokens and the same noise draws."""
    from solvers.particle_field import ParticleField
    from solvers.particles import Integrator, ParticleSystem

    B = [[1.0 if i == j else 0.2 * (i - j) for j in range(dim)] for i in range(dim)]
    V = [[1.0 if i == j else 0.1 for j in range(dim)] for i in range(dim)]
    system = ParticleSystem(case_from_dict({
        "case": {"name": "generic"}, "sphere": {"dim": dim, "lmax": 8},
        "model": {"kernel": kernel, "beta": beta, "B": B, "V": V, "eps": eps},
        "initial": {"kind": "uniform"},
        "time": {"t_end": 0.05, "dt": 0.01, "save_every": 0.05},
        "solver": {"method": "particles", "device": "cpu", "field": "dense", "dtype": dtype},
        "particles": {"n": n, "seed": 1, "integrator": integrator, "replicas": 2, "save": min(n, 1000)}}))
    field = ParticleField(system.batch, system.field.attention, system.field.chunk, system.field.replicas)
    field.direct = False
    generic = Integrator(integrator, field, system.batch.eps)
    draws = [system.noise().draws(stepper.draw_count(5)) for stepper in (system.integrator, generic)]
    program, other = system.x0, system.x0
    with torch.no_grad():
        for k in range(5):
            program = system.integrator.step(program, system.batch.W, 0.01, k, 5, draws[0])
            other = generic.step(other, system.batch.W, 0.01, k, 5, draws[1])
    assert system.integrator.program is not None and generic.program is None
    return float((program - other).abs().max())


@pytest.mark.parametrize("dim", [2, 3, 4])
@pytest.mark.parametrize("kernel", ["unnormalized", "softmax"])
@pytest.mark.parametrize("integrator", ["euler", "heun", "rk4"])
@pytest.mark.parametrize("eps", [0.0, 0.02])
def test_the_step_program_is_the_generic_step_on_the_kernel_sums(dim, kernel, integrator, eps):
    """Five steps of 16 tokens agree to round-off (program_against_generic_step)."""
    assert program_against_generic_step(dim, kernel, integrator, eps) <= 1e-14


@pytest.mark.parametrize("kernel", ["unnormalized", "softmax"])
@pytest.mark.parametrize("eps", [0.0, 0.02])
def test_the_step_program_in_blocks_of_query_rows_is_the_generic_step(kernel, eps):
    """Systems of 400 tokens, whose kernels the forward stages form KERNEL_BLOCK_BYTES of query rows at a time (81
    rows, five blocks): five Heun steps agree with the generic path to round-off."""
    from solvers.particle_step import KERNEL_BLOCK_BYTES

    assert KERNEL_BLOCK_BYTES // (400 * 8) < 400
    assert program_against_generic_step(3, kernel, "heun", eps, n=800) <= 1e-14


@pytest.mark.parametrize("kernel", ["unnormalized", "softmax"])
def test_a_forward_run_beyond_direct_bytes_takes_the_direct_sums(kernel):
    """Systems of 3000 tokens, whose (p, p) kernel (72 MB) exceeds DIRECT_BYTES: a forward run on the CPU, whose
    stages form it in blocks of query rows, takes the program (where it took the generic path), and five Heun
    steps with noise agree with the generic path to round-off."""
    from solvers.particle_field import DIRECT_BYTES

    assert 3000 * 3000 * 8 > DIRECT_BYTES
    assert program_against_generic_step(3, kernel, "heun", 0.02, n=6000) <= 1e-14


@pytest.mark.parametrize("dim", [2, 3])
@pytest.mark.parametrize("integrator", ["euler", "heun", "rk4"])
@pytest.mark.parametrize("eps", [0.0, 0.02])
def test_the_softmax_program_beyond_the_exponent_range_is_the_generic_step(dim, integrator, eps):
    """beta = 1000 (beta |B|_2 about 1100, beyond the unshifted kernel's 354.9 in float64): the program takes the
    softmax with each kernel row shifted by its largest logit (the generic path shifts too, in its own code), and
    five steps agree to round-off (measured: 3e-16)."""
    assert program_against_generic_step(dim, "softmax", integrator, eps, beta=1000.0) <= 1e-14


@pytest.mark.parametrize("n, beta, dtype, tolerance", [(800, 1000.0, "float64", 1e-14), (64, 100.0, "float32", 2e-6)])
def test_the_shifted_program_in_blocks_and_in_float32_is_the_generic_step(n, beta, dtype, tolerance):
    """The shifted softmax in blocks of query rows (systems of 400 tokens, each row shifted by its own largest logit
    whatever block holds it), and in float32 beyond its unshifted range of 44.4 (beta |B|_2 about 110; measured
    1.2e-7, float32's round-off)."""
    assert program_against_generic_step(3, "softmax", "heun", 0.02, n=n, beta=beta, dtype=dtype) <= tolerance


def test_the_shifted_softmax_gradient_is_the_central_differences_and_the_generic_paths():
    """A softmax training at beta = 1000 (beta |B|_2 about 1050): its transposes are by hand, on the shifted
    kernels (whose rows' ratios k_ij / Z_i they read), and dJ/dW is autograd's through the same program (1e-12
    relative; measured 2e-16), the central differences of J (1e-7; measured 1.3e-9: h = 1e-5, and J's round-off,
    now beta times larger, over h) and the generic path's, autograd through the shifted torch sums (1e-12; measured
    4e-16)."""
    case = seed_member(1, "softmax", ((1.0, 0.3), (-0.2, 0.65)), beta=1000.0)
    controls = controls_of(1)[0]
    by_hand, by_autograd = by_hand_and_by_autograd(ParticleControl(case), controls)
    assert float((by_hand.dW - by_autograd.dW).norm() / by_autograd.dW.norm()) <= 1e-12
    forward = ParticleControl(case)
    numerical = central_differences_of(forward.cost_of, controls)
    assert float((by_hand.dW - numerical).norm() / numerical.norm()) <= 1e-7
    forward.system.field.direct, forward.system.integrator.program, forward.by_hand = False, None, False
    [generic] = forward.gradients(controls[None])  # `gradient` would select a fresh system, direct again
    assert forward.system.integrator.program is None
    assert abs(generic.cost - by_hand.cost) <= 1e-14 * abs(generic.cost)
    assert float((by_hand.dW - generic.dW).norm() / generic.dW.norm()) <= 1e-12
