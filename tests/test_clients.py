"""Libraries built on ``torch.func``, handed a model whose forward is ``transform``ed: each must
give what it gives with the plain model.

Note [Client libraries against themselves]
------------------------------------------
A user of posteriors, torchopt, tensordict, torchrl, laplace-torch, curvlinops, nngeometry,
torchjd, e3nn, zuko or opacus puts ``transform`` where ``torch.compile`` would go, at the model's
forward (``model.forward = fxviews.transform(model.forward)``), and hands the model to the
library, which then changes it between calls as it always does: it swaps parameters in
(``functional_call``, ``to_module``, ``MetaSGD``), stacks them for an ensemble under ``vmap``,
registers hooks on its submodules, steps an optimizer. Each test here builds one small model
(random init, no download), copies it, transforms the copy's forward, runs the same documented
use of the library on both (same seeds, several calls with the model changing between them)
and compares everything the use returns: outputs, gradients, curvature, parameters after the
steps. The reference is the library itself on the plain model, never a number fxviews gave.
Where a graph is expected (parameters swapped in, ensembles), a signature run eagerly
(``cache_info().eager``) fails the test too; where the library registers hooks inside the
model, eager is allowed (such a call runs eagerly, saying why) and only the numbers count.
A test also fails if the library never called the transformed forward.

Tests marked :func:`fails_today` are the uses that fail on today's code, each naming the
cause and the exception it fails with; a fix removes its mark (they are strict: one that
starts passing reports it).

The libraries are the extra ``fxviews[clients]``: CI installs it into the oldest-torch
virtualenv (``make test-oldest-torch``, torch 2.11.0 with torchvision 0.26.0, which
laplace-torch and nngeometry need), where ``FXVIEWS_REQUIRE_ZOO=1`` makes a library that does
not import fail its tests instead of skipping them (:mod:`tests.real_models`). Where to put
``transform`` for each library is in docs/clients.md.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch import nn
from torch.func import functional_call
from torch.utils.data import DataLoader, TensorDataset

import fxviews
from fxviews.calls.cache import CacheInfo
from tests.real_models import require_zoo_or_skip
from tests.reference import assert_tree_close

Use = Callable[[nn.Module], Any]

_DATA = torch.Generator().manual_seed(49)
X = torch.randn(8, 3, generator=_DATA)
Y = torch.randint(0, 2, (8,), generator=_DATA)
#: Four mini-batches of four samples (two distinct ones, twice): a cached graph is reused.
BATCHES = [(X[:4], Y[:4]), (X[4:], Y[4:])] * 2


def require(*libraries: str) -> None:
    """Skip the test where one of ``libraries`` does not import (fail it under
    ``FXVIEWS_REQUIRE_ZOO=1``), naming the extra that brings them."""
    require_zoo_or_skip(*libraries, extra="clients")


def mlp(inputs: int = 3, hidden: int = 8, outputs: int = 2) -> nn.Sequential:
    """The small classifier most tests hand to the library."""
    return nn.Sequential(nn.Linear(inputs, hidden), nn.Tanh(), nn.Linear(hidden, outputs))


def state_of(model: nn.Module) -> dict[str, torch.Tensor]:
    """A copy of the model's parameters and buffers as they are now."""
    return {name: value.detach().clone() for name, value in model.state_dict().items()}


def assert_library_matches_plain(
    build: Callable[[], nn.Module], use: Use, *, graph: bool = True
) -> CacheInfo:
    """Run ``use`` on a model from ``build`` and on a copy whose forward is transformed, from
    the same random state, and assert they return the same values; where ``graph``, assert the
    transformed forward ran no signature eagerly. Returns its ``cache_info()``."""
    torch.manual_seed(0)
    plain = build()
    transformed = copy.deepcopy(plain)
    transformed.forward = fxviews.transform(transformed.forward)  # type: ignore[method-assign]
    torch.manual_seed(1)
    expected = use(plain)
    torch.manual_seed(1)
    actual = use(transformed)
    assert_tree_close(actual, expected, rtol=1e-4, atol=1e-5, msg="through transform")
    info: CacheInfo = transformed.forward.cache_info()
    assert info.hits + info.misses > 0, "the library never called the transformed forward"
    if graph:
        assert info.eager == 0, f"the transformed forward ran eagerly: {info}"
    return info


def cross_entropy_steps(model: nn.Module, optimizer: torch.optim.Optimizer) -> Iterator[Any]:
    """Train ``model`` on the mini-batches, yielding each step's loss and the state after it."""
    for x, y in BATCHES:
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        yield loss.detach(), state_of(model)


def squared_output_steps(model: nn.Module, inputs: torch.Tensor) -> Iterator[Any]:
    """Three Adam steps on the mean squared output, yielding each output and the state after."""
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    for _ in range(3):
        optimizer.zero_grad()
        out = model(inputs)
        out.pow(2).mean().backward()
        optimizer.step()
        yield out.detach(), state_of(model)


# --- torchopt -------------------------------------------------------------------------------


def test_torchopt_meta_sgd_inner_loop() -> None:
    """MAML as torchopt's docs write it: ``MetaSGD(net).step(loss)`` puts the updated
    (differentiable) parameters into the net, the outer loss differentiates through them, and
    ``recover_state_dict`` puts the meta-parameters back."""
    require("torchopt")
    import torchopt

    def use(model: nn.Module) -> Any:
        inner = torchopt.MetaSGD(model, lr=0.3)
        meta_parameters = list(model.parameters())
        start = torchopt.extract_state_dict(model)
        trail = []
        for x, y in BATCHES[:2]:
            inner_losses = []
            for _ in range(2):
                loss = nn.functional.cross_entropy(model(x), y)
                inner.step(loss)
                inner_losses.append(loss.detach())
            outer = nn.functional.cross_entropy(model(x), y)
            trail.append((inner_losses, torch.autograd.grad(outer, meta_parameters)))
            torchopt.recover_state_dict(model, start)
        return trail

    assert_library_matches_plain(mlp, use)


def test_torchopt_functional_adam() -> None:
    """torchopt's functional API: ``grad`` of a loss through ``functional_call``, then
    ``adam().update`` and ``apply_updates`` give new parameters every step."""
    require("torchopt")
    import torchopt

    def use(model: nn.Module) -> Any:
        params = {name: p.detach() for name, p in model.named_parameters()}
        optimizer = torchopt.adam(lr=0.1)
        opt_state = optimizer.init(params)
        trail = []
        for x, y in BATCHES:

            def loss(p: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> Any:
                return nn.functional.cross_entropy(functional_call(model, p, (x,)), y)

            grads = torch.func.grad(loss)(params, x, y)
            updates, opt_state = optimizer.update(grads, opt_state, params=params)
            params = torchopt.apply_updates(params, updates, inplace=False)
            trail.append((grads, params))
        return trail

    assert_library_matches_plain(mlp, use)


def test_torchopt_adam_in_place() -> None:
    """torchopt's ``torch.optim``-like ``Adam``: the parameters are updated in place, the same
    tensors the graph holds."""
    require("torchopt")
    import torchopt

    def use(model: nn.Module) -> Any:
        return list(cross_entropy_steps(model, torchopt.Adam(model.parameters(), lr=0.1)))

    assert_library_matches_plain(mlp, use)


# --- tensordict -----------------------------------------------------------------------------


def _ensemble(model: nn.Module, members: int = 3) -> list[nn.Module]:
    """``members`` copies of ``model`` with other weights."""
    copies = [copy.deepcopy(model) for _ in range(members)]
    with torch.no_grad():
        for scale, member in enumerate(copies, start=1):
            for p in member.parameters():
                p.mul_(0.5 * scale)
    return copies


def test_tensordict_ensemble_under_vmap() -> None:
    """tensordict's ensembles: ``TensorDict.from_modules(*members)`` stacks their parameters,
    and ``vmap`` over a function that calls the model inside ``params.to_module(model)``."""
    require("tensordict")
    from tensordict import TensorDict

    def use(model: nn.Module) -> Any:
        params = TensorDict.from_modules(*_ensemble(model), as_module=True)

        def call(p: Any, x: torch.Tensor) -> torch.Tensor:
            with p.to_module(model):
                return model(x)

        outputs = [torch.vmap(call, (0, None))(params, x) for x, _ in BATCHES[:2]]
        outputs.append(torch.vmap(call, (0, 0))(params, torch.stack([X[:4]] * 3)))
        loss = torch.vmap(call, (0, None))(params, X[:4]).pow(2).sum()
        return outputs, torch.autograd.grad(loss, list(params.values(True, True)))

    assert_library_matches_plain(mlp, use)


def test_tensordict_to_module_swaps() -> None:
    """``params.to_module(model)`` as a context: other weights in, the model's own back out."""
    require("tensordict")
    from tensordict import TensorDict

    def use(model: nn.Module) -> Any:
        params = TensorDict.from_module(model)
        outputs = [model(X)]
        for scale in (0.5, 2.0):
            with (params.detach() * scale).to_module(model):
                outputs.append(model(X))
        outputs.append(model(X))
        return outputs

    assert_library_matches_plain(mlp, use)


# --- torchrl --------------------------------------------------------------------------------


def test_torchrl_multi_agent_mlp() -> None:
    """torchrl's ``MultiAgentMLP`` (one MLP per agent, parameters stacked and swapped in under
    ``vmap``), trained a few steps with Adam."""
    require("torchrl")
    from torchrl.modules import MultiAgentMLP

    observations = torch.randn(5, 4, 3, generator=torch.Generator().manual_seed(5))

    def build() -> nn.Module:
        return MultiAgentMLP(
            n_agent_inputs=3,
            n_agent_outputs=2,
            n_agents=4,
            centralized=False,
            share_params=False,
            depth=2,
            num_cells=8,
        )

    def use(model: nn.Module) -> Any:
        return list(squared_output_steps(model, observations))

    assert_library_matches_plain(build, use)


def test_torchrl_dqn_loss_with_target_network() -> None:
    """torchrl's ``DQNLoss`` over a ``QValueActor`` (the docs' plain ``nn.Module`` value
    network), with a delayed target network whose parameters the loss swaps in with
    ``to_module``, Adam steps and ``SoftUpdate`` of the target."""
    require("torchrl")
    from tensordict import TensorDict
    from torchrl.data import OneHot
    from torchrl.modules import QValueActor
    from torchrl.objectives import DQNLoss, SoftUpdate

    spec = OneHot(3)
    g = torch.Generator().manual_seed(6)
    data = TensorDict(
        {
            "observation": torch.randn(6, 4, generator=g),
            "action": nn.functional.one_hot(torch.randint(0, 3, (6,), generator=g), 3),
            ("next", "observation"): torch.randn(6, 4, generator=g),
            ("next", "done"): torch.zeros(6, 1, dtype=torch.bool),
            ("next", "terminated"): torch.zeros(6, 1, dtype=torch.bool),
            ("next", "reward"): torch.randn(6, 1, generator=g),
        },
        [6],
    )

    def use(model: nn.Module) -> Any:
        actor = QValueActor(model, in_keys=["observation"], spec=spec)
        loss = DQNLoss(actor, action_space=spec, delay_value=True)
        target = SoftUpdate(loss, eps=0.5)
        optimizer = torch.optim.Adam(loss.parameters(), lr=0.1)
        trail = []
        for _ in range(3):
            optimizer.zero_grad()
            value = loss(data.clone())["loss"]
            value.backward()
            optimizer.step()
            target.step()
            trail.append((value.detach(), state_of(model)))
        return trail

    assert_library_matches_plain(lambda: mlp(4, 8, 3), use)


# --- posteriors -----------------------------------------------------------------------------


def _posteriors_updates(model: nn.Module, build: Callable[[Any], Any]) -> Any:
    """posteriors' pattern: a log posterior through ``functional_call``, a transform built on
    it, ``init`` at the model's parameters and an ``update`` per mini-batch."""
    import posteriors

    def log_posterior(params: Any, batch: Any) -> Any:
        logits = functional_call(model, params, (batch[0],))
        log_likelihood = -nn.functional.cross_entropy(logits, batch[1])
        return log_likelihood + posteriors.diag_normal_log_prob(params) / len(X), logits

    transform = build(log_posterior)
    state = transform.init(dict(model.named_parameters()))
    trail = []
    for batch in BATCHES:
        state, aux = transform.update(state, batch)
        trail.append((state.to_dict(), aux))
    return trail


@pytest.mark.parametrize("method", ["laplace.diag_fisher", "vi.diag", "sgmcmc.sghmc"])
def test_posteriors(method: str) -> None:
    """posteriors' diagonal-Fisher Laplace (per-sample ``jacrev``), diagonal VI (Adam through
    torchopt on sampled parameters) and SGHMC."""
    require("posteriors", "torchopt")
    import posteriors
    import torchopt

    builders = {
        "laplace.diag_fisher": posteriors.laplace.diag_fisher.build,
        "vi.diag": lambda lp: posteriors.vi.diag.build(
            lp, optimizer=torchopt.adam(lr=1e-2), init_log_sds=-2.0
        ),
        "sgmcmc.sghmc": lambda lp: posteriors.sgmcmc.sghmc.build(lp, lr=1e-2),
    }
    assert_library_matches_plain(mlp, lambda model: _posteriors_updates(model, builders[method]))


# --- curvlinops and laplace-torch -----------------------------------------------------------


@pytest.mark.parametrize(
    "operator",
    ["GGNLinearOperator", "EFLinearOperator", "KFACLinearOperator"],
)
def test_curvlinops(operator: str) -> None:
    """curvlinops' GGN, empirical Fisher (``functional_call`` with ``jvp``/``vjp`` under
    ``vmap``) and KFAC (forward hooks and tensor hooks on the model's layers) times a vector,
    before and after the model's weights change."""
    require("curvlinops")
    import curvlinops

    vector = torch.randn(50, generator=torch.Generator().manual_seed(7))

    def use(model: nn.Module) -> Any:
        params = list(model.parameters())
        products = []
        for _ in range(2):
            op = getattr(curvlinops, operator)(
                model, nn.CrossEntropyLoss(), params, BATCHES[:2], check_deterministic=False
            )
            products.append(op @ vector)
            with torch.no_grad():
                for p in params:
                    p.mul_(0.5)
        return products

    assert_library_matches_plain(mlp, use, graph=operator != "KFACLinearOperator")


@pytest.mark.parametrize(
    "approximation",
    [
        "all diag GGN",
        "all diag EF",
        pytest.param(
            "last_layer kron",
            marks=pytest.mark.xfail(
                strict=True,
                raises=ValueError,
                reason="a limit (docs/clients.md): LLLaplace deep-copies the model, and the "
                "copy's forward attribute is the same transformed function, bound to the "
                "original model (as with torch.compile put there), so the hooks its "
                "FeatureExtractor registers on the copy's layers never fire: 'Something went "
                "wrong (all modules have children)'",
            ),
        ),
    ],
)
def test_laplace_torch(approximation: str) -> None:
    """laplace-torch's ``Laplace(model, "classification", ...)``: ``fit`` on a loader, the
    marginal likelihood and the GLM predictive; then an SGD step of the model and again.
    The diagonal ones through curvlinops' GGN and EF backends, the last-layer one through its
    feature extractor (a forward hook on the last layer)."""
    require("laplace", "curvlinops")
    from laplace import Laplace
    from laplace.curvature import CurvlinopsEF, CurvlinopsGGN

    subset, structure, *backend = approximation.split()
    options = {"backend": {"GGN": CurvlinopsGGN, "EF": CurvlinopsEF}[backend[0]]} if backend else {}
    loader = DataLoader(TensorDataset(X, Y), batch_size=4)

    def use(model: nn.Module) -> Any:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
        trail = []
        for _ in range(2):
            la = Laplace(model, "classification", subset, structure, **options)
            la.fit(loader)
            trail.append((la.log_marginal_likelihood().detach(), la(X, pred_type="glm")))
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(X), Y).backward()
            optimizer.step()
        return trail

    assert_library_matches_plain(mlp, use, graph=subset == "all")


# --- nngeometry -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "matrix",
    [
        "FIM diag",
        "Hessian dense",
    ],
)
def test_nngeometry(matrix: str) -> None:
    """nngeometry's ``FIM`` (its hook backend: forward hooks and tensor hooks registered for
    each computation) and ``Hessian`` (``hessian`` through ``functional_call``), computed twice
    with the weights changed in between."""
    require("nngeometry")
    from nngeometry.hessian import Hessian
    from nngeometry.metrics import FIM
    from nngeometry.object import PMatDense, PMatDiag

    loader = DataLoader(TensorDataset(X, Y), batch_size=4)

    def use(model: nn.Module) -> Any:
        diagonals = []
        for _ in range(2):
            if matrix.startswith("Hessian"):
                pmat = Hessian(model, loader, PMatDense, function=nn.functional.cross_entropy)
            else:
                pmat = FIM(model, loader, PMatDiag, variant="classif_logits")
            diagonals.append(pmat.get_diag())
            with torch.no_grad():
                for p in model.parameters():
                    p.mul_(0.5)
        return diagonals

    assert_library_matches_plain(mlp, use, graph=matrix.startswith("Hessian"))


# --- torchjd --------------------------------------------------------------------------------


def test_torchjd_autojac() -> None:
    """torchjd's Jacobian descent: ``autojac.backward`` of the per-sample losses, aggregated
    into ``.grad`` by ``jac_to_grad`` (MGDA), an SGD step."""
    require("torchjd")
    from torchjd.aggregation import MGDA
    from torchjd.autojac import backward, jac_to_grad

    def use(model: nn.Module) -> Any:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        trail = []
        for x, y in BATCHES:
            losses = nn.functional.cross_entropy(model(x), y, reduction="none")
            backward(losses)
            jac_to_grad(model.parameters(), MGDA())
            optimizer.step()
            optimizer.zero_grad()
            trail.append((losses.detach(), state_of(model)))
        return trail

    assert_library_matches_plain(mlp, use)


def test_torchjd_autogram() -> None:
    """torchjd's autogram ``Engine(model, batch_dim=0)`` (hooks on the model's modules): the
    Gramian of the per-sample losses, weighted by MGDA, an SGD step."""
    require("torchjd")
    from torchjd.aggregation import MGDAWeighting
    from torchjd.autogram import Engine

    def use(model: nn.Module) -> Any:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        engine = Engine(model, batch_dim=0)
        weighting = MGDAWeighting()
        trail = []
        for x, y in BATCHES:
            losses = nn.functional.cross_entropy(model(x), y, reduction="none")
            gramian = engine.compute_gramian(losses)
            losses.backward(weighting(gramian))
            optimizer.step()
            optimizer.zero_grad()
            trail.append((gramian.detach(), state_of(model)))
        return trail

    assert_library_matches_plain(mlp, use, graph=False)


# --- e3nn -----------------------------------------------------------------------------------


def test_e3nn_equivariant_layers() -> None:
    """e3nn's ``FullyConnectedTensorProduct`` and ``o3.Linear`` (modules holding ``Irreps``
    and code e3nn generates with ``torch.fx``), trained a few steps with Adam."""
    require("e3nn")
    from e3nn import o3

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            irreps = o3.Irreps("2x0e + 1x1o")
            self.product = o3.FullyConnectedTensorProduct(irreps, irreps, "3x0e + 1x1o")
            self.readout = o3.Linear("3x0e + 1x1o", "1x0e")

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.readout(self.product(x, x))

    x = torch.randn(5, 5, generator=torch.Generator().manual_seed(8))

    def use(model: nn.Module) -> Any:
        return list(squared_output_steps(model, x))

    assert_library_matches_plain(Net, use)


# --- zuko -----------------------------------------------------------------------------------


def zuko_flow() -> nn.Module:
    """zuko's conditional neural spline flow, small."""
    import zuko

    return zuko.flows.NSF(features=2, context=3, transforms=2, hidden_features=(8, 8))


def test_zuko_flow_forward_runs_eagerly(caplog: pytest.LogCaptureFixture) -> None:
    """``flow(c)`` is a distribution zuko builds on each call, lazily: its transforms call
    the networks only when ``log_prob`` or ``rsample`` runs. A graph would hand the first call's
    distribution out for every call, so the transformed forward runs eagerly, says so, and
    training through it is eager's."""
    require("zuko")
    g = torch.Generator().manual_seed(9)
    x, c = torch.randn(6, 2, generator=g), torch.randn(6, 3, generator=g)

    def use(model: nn.Module) -> Any:
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
        trail: list[Any] = []
        for _ in range(3):
            flow = model(c)
            assert flow is not model(c), "each call builds its own distribution"
            loss = -flow.log_prob(x).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            trail.append((loss.detach(), state_of(model)))
        trail.append(model(c).rsample())
        return trail

    with caplog.at_level("WARNING", logger="fxviews"):
        info = assert_library_matches_plain(zuko_flow, use, graph=False)
    assert info.eager == 1, info
    assert "returns a NormalizingFlow it makes on each call" in caplog.text


def test_zuko_flow_loss_traced() -> None:
    """Where zuko's networks run, the negative log-likelihood and a sample, transformed as
    functions of the data: one graph each, reused through three Adam steps that change the
    parameters it reads, with eager's losses, parameters and random stream."""
    require("zuko")
    g = torch.Generator().manual_seed(9)
    x, c = torch.randn(6, 2, generator=g), torch.randn(6, 3, generator=g)
    torch.manual_seed(0)
    plain = zuko_flow()
    model = copy.deepcopy(plain)

    def run(flow: nn.Module, wrap: Callable[[Callable[..., Any]], Callable[..., Any]]) -> Any:
        nll = wrap(lambda x, c: -flow(c).log_prob(x).mean())
        sample = wrap(lambda c: flow(c).rsample())
        optimizer = torch.optim.Adam(flow.parameters(), lr=1e-2)
        trail: list[Any] = []
        torch.manual_seed(1)
        for _ in range(3):
            loss = nll(x, c)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            trail.append((loss.detach(), state_of(flow), sample(c), torch.rand(())))
        return trail, (nll, sample)

    expected, _ = run(plain, lambda fn: fn)
    actual, transformed = run(model, fxviews.transform)
    assert_tree_close(actual, expected, rtol=1e-4, atol=1e-5, msg="through transform")
    for fn in transformed:
        info = fn.cache_info()
        assert (info.misses, info.hits, info.eager) == (1, 2, 0), info


# --- opacus ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "mode",
    [
        "hooks",
        "functorch",
        "hooks after a call",
    ],
)
def test_opacus_private_training(mode: str) -> None:
    """opacus' ``PrivacyEngine().make_private`` (per-sample gradients by hooks on the layers,
    or by ``functorch``), clipped, without noise (so the runs are comparable), SGD steps;
    ``after a call``: the model ran once before it was made private."""
    require("opacus")
    from opacus import PrivacyEngine

    def use(model: nn.Module) -> Any:
        trail: list[Any] = [model(X[:4])] if mode.endswith("after a call") else []
        private, optimizer, loader = PrivacyEngine().make_private(
            module=model,
            optimizer=torch.optim.SGD(model.parameters(), lr=0.5),
            data_loader=DataLoader(TensorDataset(X, Y), batch_size=4),
            noise_multiplier=0.0,
            max_grad_norm=0.5,
            poisson_sampling=False,
            grad_sample_mode=mode.split()[0],
        )
        for _ in range(2):
            for x, y in loader:
                optimizer.zero_grad()
                nn.functional.cross_entropy(private(x), y).backward()
                trail.append([p.grad_sample.clone() for p in private.parameters()])
                optimizer.step()
                trail.append(state_of(model))
        return trail

    assert_library_matches_plain(mlp, use, graph=False)
