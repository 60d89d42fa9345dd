"""Programs that use autograd above the dispatcher, written as the code that uses them is.

Each builder returns a fresh :class:`Program` from a fixed seed, so two calls give two
instances with equal values (one run eagerly, one through ``fxviews.transform``) and their
state can be compared call after call. The programs: a DQN TD target (``no_grad``), a BYOL/EMA
teacher (in-place EMA under ``no_grad``), distillation, QAT with a straight-through estimator
(a custom ``autograd.Function``, and the ``detach`` trick), a DANN gradient-reversal layer, a
WGAN-GP penalty (``autograd.grad(create_graph=True)``), a custom activation with its own
``jvp``, an old-style Function, saliency by ``autograd.grad``, ``detach_``, a ``torch.func.grad``
nested inside, ``@torch.no_grad()`` helpers with ``set_grad_enabled``/``enable_grad`` nested,
an EMA buffer, an ``inference_mode`` constant; and the constructs a graph cannot keep: hooks
(tensor and module), checkpointing, saved-tensor hooks, ``inference_mode`` inside, a WGAN-GP
critic whose backward reads a saved output.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["PROGRAMS", "Program", "SAMPLE_SHAPE"]

#: The shape of one sample of every argument: two rows of four features.
SAMPLE_SHAPE = (2, 4)


@dataclass
class Program:
    """``fn`` of ``arity`` arguments of :data:`SAMPLE_SHAPE`, returning a scalar loss.

    ``state`` holds every tensor a call may update or accumulate gradients into (parameters,
    buffers, closed-over tensors). ``refused`` names the construct ``transform`` must refuse
    (run eagerly), or is None where it keeps a graph. ``routes`` limits the routes where eager
    behaviour is defined by more than an implementation limit of eager ``torch.func`` (None:
    all). ``per_sample`` is False for programs whose calls update state (one ``vmap`` call is
    not a loop of per-sample calls): their ``vmap`` reference is eager ``vmap``.
    """

    name: str
    fn: Callable[..., torch.Tensor]
    arity: int
    state: list[torch.Tensor]
    refused: str | None = None
    routes: tuple[str, ...] | None = None
    per_sample: bool = True
    keep: list[object] = field(default_factory=list)  # modules the closures need alive


def _seeded_modules(seed: int, *modules: Callable[[], nn.Module]) -> list[nn.Module]:
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return [make().double() for make in modules]


def _mlp(inputs: int, hidden: int, outputs: int) -> Callable[[], nn.Module]:
    return lambda: nn.Sequential(nn.Linear(inputs, hidden), nn.Tanh(), nn.Linear(hidden, outputs))


def _params(*modules: nn.Module) -> list[torch.Tensor]:
    return [p for module in modules for p in module.parameters()]


# --- grad-mode regions ------------------------------------------------------------------------


def dqn_td() -> Program:
    """Semi-gradient TD(0): the target comes from the same Q-network, under ``no_grad``."""
    (q_net,) = _seeded_modules(0, _mlp(4, 6, 3))
    action = torch.tensor([0.0, 1.0, 0.0], dtype=torch.float64)

    def td_loss(s: torch.Tensor, s_next: torch.Tensor) -> torch.Tensor:
        q = (q_net(s) * action).sum(-1)
        with torch.no_grad():
            target = 0.5 + 0.9 * q_net(s_next).max(-1).values
        return F.smooth_l1_loss(q, target)

    return Program("dqn_td", td_loss, 2, _params(q_net), keep=[q_net])


def byol_ema() -> Program:
    """BYOL: the teacher follows the student by an EMA written in place under ``no_grad`` (its
    parameters still require grad, as when it is built by deepcopy), and targets come from it."""
    student, predictor = _seeded_modules(1, lambda: nn.Sequential(nn.Linear(4, 4), nn.Tanh()),
                                         lambda: nn.Linear(4, 4))  # fmt: skip
    teacher = copy.deepcopy(student)

    def byol_loss(x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            for t, s in zip(teacher.parameters(), student.parameters(), strict=True):
                t.mul_(0.9).add_(s, alpha=0.1)
            z = teacher(x2)
        p = predictor(student(x1))
        return 2 - 2 * F.cosine_similarity(p, z, dim=-1).mean()

    state = _params(student, predictor, teacher)
    return Program("byol_ema", byol_loss, 2, state, per_sample=False, keep=[teacher])


def distillation() -> Program:
    """Knowledge distillation: soft targets of a teacher under ``no_grad``, same input."""
    teacher, student = _seeded_modules(2, _mlp(4, 8, 3), _mlp(4, 5, 3))
    temperature = 2.0

    def kd_loss(x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            soft = F.softmax(teacher(x) / temperature, dim=-1)
        log_p = F.log_softmax(student(x) / temperature, dim=-1)
        return F.kl_div(log_p, soft, reduction="batchmean") * temperature**2

    return Program("distillation", kd_loss, 1, _params(teacher, student), keep=[teacher])


@torch.no_grad()
def _running_scale(h: torch.Tensor) -> torch.Tensor:
    return h.abs().mean(-1, keepdim=True) + 1


def nested_grad_modes() -> Program:
    """A ``@torch.no_grad()`` helper, ``set_grad_enabled(False)`` with ``enable_grad`` inside."""
    (layer,) = _seeded_modules(3, lambda: nn.Linear(4, 4))

    def normalized(x: torch.Tensor) -> torch.Tensor:
        h = layer(x)
        scale = _running_scale(h)
        with torch.set_grad_enabled(False):
            centre = h.mean(-1, keepdim=True)
            with torch.enable_grad():
                gate = torch.sigmoid(h)
        return ((h - centre) / scale * gate).pow(2).sum()

    return Program("nested_grad_modes", normalized, 1, _params(layer), keep=[layer])


def ema_buffer() -> Program:
    """A running mean kept in a closed-over buffer, updated in place under ``no_grad``."""
    running = torch.zeros(4, dtype=torch.float64)

    def centred_energy(x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            running.mul_(0.9).add_(x.mean(0), alpha=0.1)
        return (x - running).pow(2).sum()

    return Program("ema_buffer", centred_energy, 1, [running], per_sample=False)


# --- custom autograd.Functions ----------------------------------------------------------------


class FakeQuantize(torch.autograd.Function):
    """Quantization-aware training: round in the forward, pass the gradient straight through
    where the value was in range."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x: torch.Tensor, scale: float) -> torch.Tensor:  # type: ignore[override]
        return torch.clamp(torch.round(x * scale), -8, 7) / scale

    @staticmethod
    def setup_context(ctx, inputs, output):  # type: ignore[no-untyped-def]
        x, scale = inputs
        ctx.save_for_backward((x * scale).abs() <= 8)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def]
        (inside,) = ctx.saved_tensors
        return grad * inside, None


def qat_ste() -> Program:
    (layer,) = _seeded_modules(4, lambda: nn.Linear(4, 3))

    def quantized(x: torch.Tensor) -> torch.Tensor:
        weight = FakeQuantize.apply(layer.weight, 4.0)
        return torch.tanh(F.linear(FakeQuantize.apply(x, 4.0), weight, layer.bias)).pow(2).sum()

    return Program("qat_ste", quantized, 1, _params(layer), keep=[layer])


def qat_detach_trick() -> Program:
    """The straight-through estimator written with ``detach``."""
    (layer,) = _seeded_modules(5, lambda: nn.Linear(4, 3))

    def ste(t: torch.Tensor) -> torch.Tensor:
        return t + (torch.round(t * 4) / 4 - t).detach()

    def quantized(x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(F.linear(ste(x), ste(layer.weight), layer.bias)).pow(2).sum()

    return Program("qat_detach_trick", quantized, 1, _params(layer), keep=[layer])


class GradientReversal(torch.autograd.Function):
    """DANN's gradient-reversal layer: identity forward, ``-alpha *`` gradient backward."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x: torch.Tensor, alpha: float) -> torch.Tensor:  # type: ignore[override]
        return x.view_as(x)

    @staticmethod
    def setup_context(ctx, inputs, output):  # type: ignore[no-untyped-def]
        ctx.alpha = inputs[1]

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def]
        return grad.neg() * ctx.alpha, None


def dann() -> Program:
    features, labels, domains = _seeded_modules(
        6, lambda: nn.Sequential(nn.Linear(4, 5), nn.ReLU()), lambda: nn.Linear(5, 3),
        lambda: nn.Linear(5, 2),
    )  # fmt: skip

    def dann_loss(x: torch.Tensor) -> torch.Tensor:
        f = features(x)
        domain = domains(GradientReversal.apply(f, 0.3))
        return labels(f).logsumexp(-1).mean() + domain.logsumexp(-1).mean()

    return Program("dann", dann_loss, 1, _params(features, labels, domains), keep=[features])


class SoftClip(torch.autograd.Function):
    """A custom activation whose backward and jvp are a damped surrogate of tanh's derivative
    (not autograd's of its forward, so a graph that replaced them would show)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return torch.tanh(x)

    @staticmethod
    def setup_context(ctx, inputs, output):  # type: ignore[no-untyped-def]
        ctx.save_for_backward(output)
        ctx.save_for_forward(output)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def]
        (y,) = ctx.saved_tensors
        return grad * (1 - y * y) * 0.5

    @staticmethod
    def jvp(ctx, tangent):  # type: ignore[no-untyped-def]
        (y,) = ctx.saved_tensors
        return tangent * (1 - y * y) * 0.5


def custom_activation() -> Program:
    (layer,) = _seeded_modules(7, lambda: nn.Linear(4, 4))

    def activated(x: torch.Tensor) -> torch.Tensor:
        return (SoftClip.apply(layer(x)) * x).sum()

    return Program("custom_activation", activated, 1, _params(layer), keep=[layer])


class ScaledIdentity(torch.autograd.Function):
    """An old-style Function (``forward(ctx, ...)``): autograd only, refused by ``torch.func``."""

    @staticmethod
    def forward(ctx, x):  # type: ignore[no-untyped-def, override]
        return x * 2

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def, override]
        return grad * 3


def old_style_function() -> Program:
    def scaled(x: torch.Tensor) -> torch.Tensor:
        return (ScaledIdentity.apply(x) * x).sum()

    return Program("old_style_function", scaled, 1, [])


# --- the autograd API inside fn ---------------------------------------------------------------


def _critic(activation: Callable[[], nn.Module], seed: int) -> nn.Module:
    (critic,) = _seeded_modules(
        seed, lambda: nn.Sequential(nn.Linear(4, 6), activation(), nn.Linear(6, 1))
    )
    return critic


def _gradient_penalty(critic: nn.Module) -> Callable[..., torch.Tensor]:
    eps = torch.tensor([[0.3], [0.8]], dtype=torch.float64)

    def critic_loss(real: torch.Tensor, fake: torch.Tensor) -> torch.Tensor:
        interp = (eps * real + (1 - eps) * fake).requires_grad_(True)
        score = critic(interp)
        (grad,) = torch.autograd.grad(score.sum(), interp, create_graph=True)
        penalty = ((grad.norm(2, dim=-1) - 1) ** 2).mean()
        return critic(fake).mean() - critic(real).mean() + 10 * penalty

    return critic_loss


#: eager ``torch.func`` refuses ``requires_grad_`` inside a transform: only autograd's routes.
_AUTOGRAD_ROUTES = ("backward", "backward_params")


def wgan_gp() -> Program:
    critic = _critic(lambda: nn.LeakyReLU(0.2), 8)
    return Program("wgan_gp", _gradient_penalty(critic), 2, _params(critic),
                   routes=_AUTOGRAD_ROUTES, keep=[critic])  # fmt: skip


def wgan_gp_saved_output() -> Program:
    """The penalty's backward reads tanh's saved output, which a trace records detached."""
    critic = _critic(nn.Tanh, 9)
    return Program(
        "wgan_gp_saved_output", _gradient_penalty(critic), 2, _params(critic),
        refused="torch.autograd.grad(create_graph=True)", routes=_AUTOGRAD_ROUTES, keep=[critic],
    )  # fmt: skip


def saliency() -> Program:
    """``autograd.grad`` without ``create_graph``: a saliency map used as a constant weight."""
    (net,) = _seeded_modules(10, _mlp(4, 5, 1))

    def saliency_weighted(x: torch.Tensor) -> torch.Tensor:
        with torch.enable_grad():
            probe = x.detach().requires_grad_()
            (saliency_map,) = torch.autograd.grad(net(probe).sum(), probe)
        return (saliency_map.abs() * x).sum() + net(x).sum()

    return Program("saliency", saliency_weighted, 1, _params(net), keep=[net])


def detach_in_place() -> Program:
    (layer,) = _seeded_modules(11, lambda: nn.Linear(4, 4))

    def frozen_copy(x: torch.Tensor) -> torch.Tensor:
        h = layer(x)
        frozen = h.clone().detach_()
        return (h * frozen).sum()

    return Program("detach_in_place", frozen_copy, 1, _params(layer), keep=[layer])


def nested_func_grad() -> Program:
    """``torch.func.grad`` inside the function: the caller differentiates a gradient."""
    (layer,) = _seeded_modules(12, lambda: nn.Linear(4, 4))

    def input_gradient_norm(x: torch.Tensor) -> torch.Tensor:
        g = torch.func.grad(lambda a: layer(a).tanh().sum())(x)
        return g.pow(2).sum()

    return Program("nested_func_grad", input_gradient_norm, 1, _params(layer), keep=[layer])


def inference_constant() -> Program:
    """A table built under ``inference_mode`` once, then read by every call."""
    with torch.inference_mode():
        table = torch.linspace(-1, 1, 4, dtype=torch.float64).expand(2, 4).clone()

    def shifted(x: torch.Tensor) -> torch.Tensor:
        return (x * 2 + table).sin().sum()

    return Program("inference_constant", shifted, 1, [])


# --- what a graph cannot keep -----------------------------------------------------------------


def tensor_hook() -> Program:
    (layer,) = _seeded_modules(13, lambda: nn.Linear(4, 4))

    def damped(x: torch.Tensor) -> torch.Tensor:
        h = layer(x)
        if h.requires_grad:
            h.register_hook(lambda g: g * 0.5)
        return h.tanh().sum()

    return Program("tensor_hook", damped, 1, _params(layer), refused="Tensor.register_hook",
                   keep=[layer])  # fmt: skip


def module_backward_hook() -> Program:
    (layer,) = _seeded_modules(14, lambda: nn.Linear(4, 4))
    layer.register_full_backward_hook(lambda module, grad_in, grad_out: (grad_in[0] * 0.5,))

    def through_hooked(x: torch.Tensor) -> torch.Tensor:
        return layer(x).tanh().sum()

    return Program("module_backward_hook", through_hooked, 1, _params(layer),
                   refused="backward hooks on Linear", keep=[layer])  # fmt: skip


def checkpointed() -> Program:
    block, head = _seeded_modules(15, _mlp(4, 6, 4), lambda: nn.Linear(4, 1))

    def recomputed(x: torch.Tensor) -> torch.Tensor:
        h = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
        return head(h).sum()

    return Program("checkpointed", recomputed, 1, _params(block, head),
                   refused="saved-tensor hooks", keep=[block])  # fmt: skip


def lossy_saved_tensors() -> Program:
    """Saved activations stored in half precision: backward computes from rounded values."""
    (layer,) = _seeded_modules(16, lambda: nn.Linear(4, 4))

    def compressed(x: torch.Tensor) -> torch.Tensor:
        with torch.autograd.graph.saved_tensors_hooks(lambda t: t.half(), lambda t: t.double()):
            return layer(x).exp().sum()

    return Program("lossy_saved_tensors", compressed, 1, _params(layer),
                   refused="saved-tensor hooks", keep=[layer])  # fmt: skip


def inference_mode_inside() -> Program:
    def offset(x: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():
            centre = x.mean()
        return (x + centre).pow(2).sum()

    return Program("inference_mode_inside", offset, 1, [], refused="torch.inference_mode()")


PROGRAMS: dict[str, Callable[[], Program]] = {
    build.__name__: build
    for build in (
        dqn_td,
        byol_ema,
        distillation,
        nested_grad_modes,
        ema_buffer,
        qat_ste,
        qat_detach_trick,
        dann,
        custom_activation,
        old_style_function,
        wgan_gp,
        wgan_gp_saved_output,
        saliency,
        detach_in_place,
        nested_func_grad,
        inference_constant,
        tensor_hook,
        module_backward_hook,
        checkpointed,
        lossy_saved_tensors,
        inference_mode_inside,
    )
}
